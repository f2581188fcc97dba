"""Allocation history with Python frames, and snapshots in PyTorch's format, through the package."""
import json
import os
import pickle
import sys

import pytest

MiB = 1 << 20
HERE = os.path.abspath(__file__)


def lineno():
    return sys._getframe(1).f_lineno


def frames_name_here(frames, line):
    return any(os.path.abspath(f["filename"]) == HERE and f["line"] == line for f in frames)


def test_history_records_python_frames(xseg):
    xseg.record_memory_history(clear_history=True)
    try:
        line = lineno() + 1
        p = xseg.malloc(3 * MiB)
        snap = xseg._snapshot()
        blocks = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == p]
        assert len(blocks) == 1 and blocks[0]["state"] == "active_allocated"
        top = blocks[0]["frames"][0]
        assert os.path.abspath(top["filename"]) == HERE, blocks[0]["frames"]
        assert top["line"] == line and top["name"] == "test_history_records_python_frames"
        trace = [e for dev in snap["device_traces"] for e in dev]
        allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == p]
        assert allocs and allocs[-1]["size"] >= 3 * MiB
        assert frames_name_here(allocs[-1]["frames"], line)
        xseg.free(p)
        trace = [e for dev in xseg._snapshot()["device_traces"] for e in dev]
        actions = [e["action"] for e in trace if e.get("addr") == p]
        assert "free_requested" in actions and "free_completed" in actions
    finally:
        xseg.record_memory_history(enabled=None)


def test_history_without_context_has_no_frames(xseg):
    xseg.record_memory_history(context=None, clear_history=True)
    try:
        p = xseg.malloc(MiB)
        trace = [e for dev in xseg._snapshot()["device_traces"] for e in dev]
        allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == p]
        assert allocs and not allocs[-1]["frames"]
        xseg.free(p)
    finally:
        xseg.record_memory_history(enabled=None)


def test_history_arguments_are_checked(xseg):
    # Each invalid value is a ValueError naming the argument; nothing changes, and recording works after.
    for kwargs, name in (({"enabled": "everything"}, "enabled"), ({"enabled": 1}, "enabled"),
                         ({"enabled": ["all"]}, "enabled"), ({"context": "stack"}, "context"),
                         ({"context": True}, "context"), ({"stacks": "cpp"}, "stacks"),
                         ({"stacks": None}, "stacks")):
        with pytest.raises(ValueError, match="xseg.record_memory_history: %s must be" % name):
            xseg.record_memory_history(**kwargs)
    with pytest.raises(xseg.XsegError) as ei:
        xseg.record_memory_history(max_frames=100000)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"
    assert recorded(xseg, True) == (True, True)


def recorded(xseg, *args, **kwargs):
    """Start history with PyTorch's argument form, allocate, and say (whether the trace has the
    alloc event, whether the live block carries this file's frames); history is stopped after."""
    xseg.record_memory_history(*args, clear_history=True, **kwargs)
    try:
        p = xseg.malloc(MiB)
        try:
            snap = xseg._snapshot()
        finally:
            xseg.free(p)
    finally:
        xseg.record_memory_history(enabled=None)
    trace = [e for dev in snap["device_traces"] for e in dev]
    block = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == p][0]
    return (any(e["action"] == "alloc" and e["addr"] == p for e in trace),
            any(os.path.abspath(f["filename"]) == HERE for f in block["frames"]))


def test_history_accepts_pytorchs_argument_forms(xseg):
    # torch.cuda.memory._record_memory_history's forms: a bool, enabled=, "all"/"state"/None,
    # context, stacks, max_entries.
    assert recorded(xseg, True) == (True, True)
    assert recorded(xseg, "all") == (True, True)
    assert recorded(xseg, enabled="all", context="all", stacks="all", max_entries=sys.maxsize) == (True, True)
    assert recorded(xseg, "state") == (False, True)                 # live blocks' frames, no trace
    assert recorded(xseg, enabled="all", context=None) == (True, False)
    assert recorded(xseg, "all", context="alloc", max_entries=1000) == (True, True)
    # None and False stop: what is allocated afterwards is not recorded.
    for off in (None, False):
        xseg.record_memory_history(True, clear_history=True)
        xseg.record_memory_history(off)
        p = xseg.malloc(MiB)
        trace = [e for dev in xseg._snapshot()["device_traces"] for e in dev]
        xseg.free(p)
        assert not any(e["action"] == "alloc" and e["addr"] == p for e in trace), off


def test_snapshot_files(xseg, tmp_path):
    xseg.record_memory_history(clear_history=True)
    try:
        p = xseg.malloc(2 * MiB)
        xseg.dump_snapshot(str(tmp_path / "s.pickle"))
        xseg.dump_snapshot_json(str(tmp_path / "s.json"))
        with open(tmp_path / "s.pickle", "rb") as f:
            snap = pickle.load(f)
        with open(tmp_path / "s.json") as f:
            js = json.load(f)
        for s in (snap, js):
            assert any(b["address"] == p for seg in s["segments"] for b in seg["blocks"])
        xseg.dump_trace(str(tmp_path / "t.trace"))
        assert os.path.getsize(tmp_path / "t.trace") > 0
        xseg.free(p)
    finally:
        xseg.record_memory_history(enabled=None)
    with pytest.raises(xseg.XsegError) as ei:
        xseg.dump_snapshot(str(tmp_path / "no-such-dir" / "s.pickle"))
    assert "no-such-dir" in str(ei.value)


def test_oom_snapshot(xseg, tmp_path):
    path = tmp_path / "oom.pickle"
    xseg.set_oom_snapshot(str(path))
    try:
        xseg.set_per_process_memory_fraction(0.01, 0)
        with pytest.raises(xseg.XsegOutOfMemoryError) as ei:
            xseg.malloc(1 << 40)
        assert path.exists() and str(path) in str(ei.value)
    finally:
        xseg.set_oom_snapshot(None)
