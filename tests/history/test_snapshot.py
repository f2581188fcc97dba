#!/usr/bin/env python3
"""The snapshots xseg writes, read the way PyTorch's tools read them (standard library only).

    test_snapshot.py TEST_HISTORY_EXE [XSEG_REPLAY_EXE]

    test_snapshot.py --stale TEST_STALE_SNAPSHOT_EXE [--memory-viz]

Runs `test_history write DIR` (classic and expandable device states with C and callback frames,
a pending free, an OOM), then for each pickle:
  - loads it with a restricted unpickler that allows no class at all (only the opcodes of dicts,
    lists, tuples, str, int, float, bool), so no global can be named;
  - checks the fields torch/cuda/_memory_viz.py and MemoryViz.js read (segments with their blocks
    tiling them, block states, requested sizes, frames as {filename, name, line}; device_traces
    with PyTorch's action names and integer addr/size/stream/time_us; oom with device_free),
    integers below 2**53 (JavaScript numbers), and the figures _memory_viz.segsum asserts;
  - checks the pickle and the JSON twin hold the same data;
  - replays the live-process log with xseg-replay (when given).
With --stale, runs `test_stale_snapshot DIR` (seed 003's cases in the stale-access mode) and checks,
besides the structure, that each quarantined block carries its free's and its allocation's frames,
that each finding is a `snapshot` trace entry both viewers draw (with both stacks, the block still
pending when it is selected in MemoryViz's segment view), and with --memory-viz runs all three stages
of ../shared/tools/memory-viz/check-snapshot on them (skipped without PyTorch's files or Chromium).
"""
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom"}
STATES = {"active_allocated", "active_pending_free", "inactive"}


class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("the snapshot names a global: %s.%s" % (module, name))


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:2] == b"\x80\x02", "not a protocol 2 pickle: %r" % data[:2]
    return NoGlobals(io.BytesIO(data)).load()


def check_types(o, where="root"):
    if isinstance(o, bool) or isinstance(o, str) or isinstance(o, float) or o is None:
        return
    if isinstance(o, int):
        assert abs(o) < 2 ** 53, "%s: %d is not a JavaScript-safe integer" % (where, o)
        return
    if isinstance(o, dict):
        for k, v in o.items():
            assert isinstance(k, str), "%s: key %r" % (where, k)
            check_types(v, "%s.%s" % (where, k))
        return
    if isinstance(o, (list, tuple)):
        for i, v in enumerate(o):
            check_types(v, "%s[%d]" % (where, i))
        return
    raise AssertionError("%s: a %s" % (where, type(o).__name__))


def check_frames(frames, where):
    assert isinstance(frames, list), where
    for f in frames:
        assert set(f) == {"filename", "name", "line"}, "%s: frame keys %s" % (where, sorted(f))
        assert isinstance(f["filename"], str) and isinstance(f["name"], str), where
        assert isinstance(f["line"], int) and not isinstance(f["line"], bool), where


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def check_structure(d, name):
    """What both viewers read: returns (segments, traces, block states seen, actions seen, blocks with frames)."""
    check_types(d)
    assert set(d) >= {"segments", "device_traces", "allocator_settings"}, sorted(d)
    segs, traces = d["segments"], d["device_traces"]
    assert isinstance(segs, list) and segs, "%s: no segments" % name
    assert isinstance(traces, list) and traces and all(isinstance(t, list) for t in traces)
    total_reserved = total_allocated = free_internal = free_external = 0
    framed_blocks = 0
    states = set()
    for i, s in enumerate(segs):
        w = "%s segments[%d]" % (name, i)
        for k in ("device", "address", "total_size", "allocated_size", "active_size",
                  "requested_size", "stream"):
            assert is_int(s[k]), "%s.%s = %r" % (w, k, s.get(k))
        assert s["segment_type"] in ("small", "large"), w
        assert isinstance(s["is_expandable"], bool), w
        assert isinstance(s["segment_pool_id"], tuple) and len(s["segment_pool_id"]) == 2, w
        assert s["device"] < len(traces), "%s: device %d has no trace list" % (w, s["device"])
        check_frames(s["frames"], w)
        addr, alloc, active = s["address"], 0, 0
        assert s["blocks"], w
        for j, b in enumerate(s["blocks"]):
            wb = "%s.blocks[%d]" % (w, j)
            assert set(b) == {"address", "size", "requested_size", "state", "frames"}, sorted(b)
            assert b["address"] == addr, "%s: address %x, expected %x" % (wb, b["address"], addr)
            assert is_int(b["size"]) and b["size"] > 0, wb
            assert b["state"] in STATES, wb
            states.add(b["state"])
            check_frames(b["frames"], wb)
            if b["frames"]:
                framed_blocks += 1
            if b["state"] != "inactive":
                assert 0 < b["requested_size"] <= b["size"], wb
                active += b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
                # _memory_viz.segsum: allocated (requested) + internal + external == total_size
                total_allocated += b["requested_size"]
                free_internal += b["size"] - b["requested_size"]
            else:
                free_external += b["size"]
            addr += b["size"]
        assert addr - s["address"] == s["total_size"], "%s: blocks do not tile it" % w
        assert alloc == s["allocated_size"] and active == s["active_size"], w
        total_reserved += s["total_size"]
    assert free_internal + free_external + total_allocated == total_reserved
    seen = set()
    for dev, t in enumerate(traces):
        last = 0
        for k, e in enumerate(t):
            w = "%s device_traces[%d][%d]" % (name, dev, k)
            assert e["action"] in ACTIONS, w
            seen.add(e["action"])
            assert is_int(e["size"]) and is_int(e["stream"]) and is_int(e["time_us"]), w
            if e["action"] == "oom":
                assert is_int(e["device_free"]) and "addr" not in e, w
            else:
                assert is_int(e["addr"]), w
            assert e["time_us"] >= last, "%s: time goes back" % w
            last = e["time_us"]
            check_frames(e["frames"], w)
    return segs, traces, states, seen, framed_blocks


def check_snapshot(d, name):
    segs, traces, states, seen, framed_blocks = check_structure(d, name)
    assert framed_blocks > 0, "%s: no block has frames" % name
    assert "active_allocated" in states and "inactive" in states, states
    assert "active_pending_free" in states, "%s: the pending free is not shown" % name
    want = {"alloc", "free_requested", "free_completed", "oom", "snapshot"}
    want |= {"segment_map"} if "expandable" in name else {"segment_alloc"}
    assert want <= seen, "%s: missing actions %s" % (name, sorted(want - seen))

    # Frames: the callback's (forward/backward at their lines) after the C frames.
    allocs = [e for e in traces[0] if e["action"] == "alloc"]
    names = [f["name"] for f in allocs[0]["frames"]]
    assert "backward" in names and "main" in names and "<module>" in names, names
    assert allocs[0]["frames"][names.index("backward")] == {"filename": "model.py", "name": "backward", "line": 100}
    names1 = [f["name"] for f in allocs[1]["frames"]]
    f = allocs[1]["frames"][names1.index("forward")]
    assert f == {"filename": "model.py", "name": "forward", "line": 101}, f
    assert names.index("backward") > 0, "no C frames before the callback's: %s" % names
    # A free carries its allocation's frames.
    frees = [e for e in traces[0] if e["action"] == "free_completed" and e["addr"] == allocs[0]["addr"]]
    assert frees and frees[0]["frames"] == allocs[0]["frames"]
    settings = d["allocator_settings"]
    assert settings["expandable_segments"] == ("expandable" in name), settings
    return len(segs), sum(len(t) for t in traces)


def untuple(o):
    if isinstance(o, dict):
        return {k: untuple(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [untuple(v) for v in o]
    return o


def pytorch_like_snapshot():
    """A small snapshot as PyTorch writes it: one live block from before the window (frames in
    `segments` only), allocations and frees in the window, each with its Python frames."""
    def frames(fn, line):
        return [{"filename": "??", "name": "c10::cuda::DeviceCachingAllocator::malloc", "line": 0},
                {"filename": "/home/u/model dir/model.py", "name": fn, "line": line},
                {"filename": "train.py", "name": "<module>", "line": 9}]
    base = 0x7f0000000000
    early = frames("embed", 5)
    trace = []
    t = 1748733587416285
    for i, (fn, size) in enumerate([("attention", 3 << 20), ("mlp", 5 << 20), ("norm", 4096)]):
        trace.append({"action": "alloc", "addr": base + (8 << 20) * (i + 1), "size": size, "stream": 0,
                      "time_us": t + i, "frames": frames(fn, 10 + i)})
    trace.append({"action": "free_requested", "addr": base + (8 << 20), "size": 3 << 20, "stream": 0,
                  "time_us": t + 5, "frames": frames("attention", 10)})
    trace.append({"action": "free_completed", "addr": base + (8 << 20), "size": 3 << 20, "stream": 0,
                  "time_us": t + 6, "frames": frames("attention", 10)})
    blocks = [{"address": base, "size": 2 << 20, "requested_size": 2 << 20, "state": "active_allocated",
               "frames": early}]
    for i, (fn, size) in enumerate([("mlp", 5 << 20), ("norm", 4096)], start=2):
        blocks.append({"address": base + (8 << 20) * i, "size": max(512, size), "requested_size": size,
                       "state": "active_allocated", "frames": frames(fn, 10 + i - 1)})
    return {"segments": [{"device": 0, "address": base, "total_size": 64 << 20, "stream": 0,
                          "segment_type": "large", "allocated_size": 0, "active_size": 0,
                          "blocks": blocks}],
            "device_traces": [trace], "allocator_settings": {}}


def check_replay_frames(replay, converter, tmp):
    """Item 5: a converted PyTorch snapshot replayed with --history --snapshot shows, for each
    live block, the frames PyTorch recorded for it; `snapshot LABEL` writes one at that point."""
    src = os.path.join(tmp, "pt.pickle")
    with open(src, "wb") as f:
        pickle.dump(pytorch_like_snapshot(), f, protocol=2)
    r = subprocess.run([sys.executable, converter, src], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "frame k0 0 ?? c10::cuda::DeviceCachingAllocator::malloc\n" in text, text
    assert "/home/u/model%20dir/model.py" in text, text
    # a `snapshot` action after the window's allocations
    text = text.replace("mark end of window", "snapshot window\nmark end of window")
    trace = os.path.join(tmp, "pt.trace")
    with open(trace, "w") as f:
        f.write(text)
    out = os.path.join(tmp, "x.pickle")
    r = subprocess.run([replay, "--history", "--snapshot", out, "--marks=none", "--summary=none", trace],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for path in (out, os.path.join(tmp, "x.window.pickle")):
        d = load(path)
        live = {}
        for s in d["segments"]:
            for b in s["blocks"]:
                if b["state"] == "active_allocated":
                    live[b["requested_size"]] = [(f["name"], f["filename"], f["line"]) for f in b["frames"]]
        assert live.get(2 << 20, [None])[1] == ("embed", "/home/u/model dir/model.py", 5), live
        assert live[5 << 20][1] == ("mlp", "/home/u/model dir/model.py", 11), live
        assert live[4096][1] == ("norm", "/home/u/model dir/model.py", 12), live
        assert (3 << 20) not in live
        acts = [e["action"] for e in d["device_traces"][0]]
        assert "alloc" in acts and "free_completed" in acts, acts
    # --compare: one snapshot per mode
    out = os.path.join(tmp, "c.pickle")
    r = subprocess.run([replay, "--compare", "--history", "--snapshot", out, "--marks=none", "--summary=none",
                        trace], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for mode in ("classic", "expandable"):
        d = load(os.path.join(tmp, "c.%s.pickle" % mode))
        assert d["allocator_settings"]["expandable_segments"] == (mode == "expandable")
        assert any(s["is_expandable"] for s in d["segments"]) == (mode == "expandable")
    print("replay: frames carried from a PyTorch snapshot into xseg's snapshot: ok")


# ---- the stale-access mode (issue 50): `--stale TEST_STALE_SNAPSHOT_EXE [--memory-viz]` ----

STALE_HEAD = "STALE WRITE (debug_stale_access): "
QUARANTINED_HEAD = "quarantined (debug_stale_access): "


def note(f):
    """The text of one of xseg's notes in a frames list, or None for a real frame."""
    return f["name"] if f["filename"] == "xseg" and f["line"] == 0 else None


def split_stale_frames(frames, where):
    """A quarantined block's or a finding's frames: [two notes, free's frames, 'allocated at:',
    allocation's frames]. Returns (the notes joined, free's function names, allocation's)."""
    assert len(frames) > 2 and note(frames[0]) and note(frames[1]), "%s: no head notes: %r" % (where, frames[:2])
    names = [f["name"] for f in frames]
    assert "allocated at:" in names, "%s: no 'allocated at:' note: %r" % (where, names)
    k = names.index("allocated at:")
    for f in frames:  # _memory_viz.py's flame graphs split a stack on ';'
        assert ";" not in f["name"] and ";" not in f["filename"], "%s: ';' in %r" % (where, f)
    return names[0] + " " + names[1], names[2:k], names[k + 1:]


def simulate_segment_view(d, dev, upto):
    """MemoryViz.js's segment view, selecting trace entry @p upto: it walks the trace backwards from
    the snapshot's state (annotate_snapshot first elides a free_requested that a free_completed of the
    same address follows into one `free`). A free_requested of a block it does not hold, or a block
    outside every segment, throws there. Returns {address: pending} of the blocks drawn."""
    events = []
    for e in d["device_traces"][dev]:
        if (e["action"] == "free_completed" and events and events[-1]["action"] == "free_requested"
                and events[-1]["addr"] == e["addr"]):
            events[-1] = dict(events[-1], action="free")
            continue
        events.append(e)
    segs = [(s["address"], s["address"] + s["total_size"]) for s in d["segments"] if s["device"] == dev]
    blocks = {}
    for s in d["segments"]:
        if s["device"] == dev:
            for b in s["blocks"]:
                if b["state"] != "inactive":
                    blocks[b["address"]] = b["state"] == "active_pending_free"
    if upto is None:
        upto = len(events) - 1
    elif isinstance(upto, dict):
        upto = next(i for i, e in enumerate(events) if e is upto or e == upto)
    for e in reversed(events[upto + 1:]):
        a = e["action"]
        if a == "free":
            blocks[e["addr"]] = False
        elif a == "free_requested":
            assert e["addr"] in blocks, "the segment view throws: free_requested of %x it does not hold" % e["addr"]
            blocks[e["addr"]] = False
        elif a == "free_completed":
            blocks[e["addr"]] = True
        elif a == "alloc":
            blocks.pop(e["addr"], None)
        elif a in ("segment_free", "segment_unmap"):
            segs.append((e["addr"], e["addr"] + e["size"]))
        elif a in ("segment_alloc", "segment_map"):
            lo, hi = e["addr"], e["addr"] + e["size"]
            segs = [r for s0, s1 in segs for r in ((s0, min(s1, lo)), (max(s0, hi), s1)) if r[0] < r[1]]
    for a in blocks:
        assert any(s0 <= a < s1 for s0, s1 in segs), "the segment view throws: block %x in no segment" % a
    return blocks


def check_stale_snapshot(d, name):
    """Quarantined blocks and findings as PyTorch's viewers show them (the program's seed-003 cases:
    the input out of scope, found when it left the quarantine; the state reassigned, found at the
    snapshot and still quarantined)."""
    segs, traces, states, seen, _ = check_structure(d, name)
    assert "active_allocated" in states and "active_pending_free" in states, states
    pending = [b for s in segs for b in s["blocks"] if b["state"] == "active_pending_free"]
    # Every quarantined block: its free's frames, then its allocation's.
    quarantined, found_held = 0, None
    for b in pending:
        head, freed, allocated = split_stale_frames(b["frames"], "%s block %x" % (name, b["address"]))
        if head.startswith(STALE_HEAD):
            assert found_held is None, "%s: two quarantined blocks with findings" % name
            found_held = (b, head, freed, allocated)
        else:
            assert head.startswith(QUARANTINED_HEAD), head
            assert freed[:1] == ["backward"] and allocated[:1] == ["forward"], (freed, allocated)
            quarantined += 1
    assert quarantined >= 2, "%s: %d quarantined blocks shown" % (name, quarantined)
    assert found_held, "%s: the block found at the snapshot is not shown with its finding" % name
    b, head, freed, allocated = found_held
    assert freed == ["state_reassigned", "<module>"] and allocated == ["make_state", "<module>"], (freed, allocated)
    assert "found at snapshot" in head and "offset 0," in head and ("%x" % b["address"]) in head, head
    # Each finding: a `snapshot` entry at the block, at the time it was found, with both stacks.
    findings = [e for e in traces[0] if e["action"] == "snapshot" and e["frames"] and note(e["frames"][0])]
    assert len(findings) == 2, "%s: %d findings in the trace" % (name, len(findings))
    exit_f, snap_f = findings
    h, freed, allocated = split_stale_frames(exit_f["frames"], name + " finding 0")
    assert h.startswith(STALE_HEAD) and "found at quarantine exit" in h, h
    assert freed == ["input_out_of_scope", "<module>"] and allocated == ["make_input", "<module>"], (freed, allocated)
    assert exit_f["size"] == 3 << 20
    h, freed, allocated = split_stale_frames(snap_f["frames"], name + " finding 1")
    assert h == head and freed[0] == "state_reassigned" and allocated[0] == "make_state", h
    assert (snap_f["addr"], snap_f["size"]) == (b["address"], b["size"])
    # The input left the quarantine after it was found: its free_completed follows the finding.
    t = traces[0]
    i = t.index(exit_f)
    assert any(e["action"] == "free_completed" and e["addr"] == exit_f["addr"] for e in t[i + 1:]), name
    # xseg's own key holds the same findings.
    own = d["xseg_stale_accesses"]
    assert [(f["address"], f["found_time_us"]) for f in own] == [(e["addr"], e["time_us"]) for e in findings]
    # The segment view, at each finding and at the end: no throw, and the block drawn pending (red).
    for e in findings:
        drawn = simulate_segment_view(d, 0, e)
        assert drawn.get(e["addr"]) is True, "%s: the block of a finding is not drawn pending" % name
    simulate_segment_view(d, 0, None)
    return len(findings), len(pending)


def memory_viz_checker():
    """The path of ../shared/tools/memory-viz/check-snapshot with what it needs, or a reason to skip."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    checker = os.environ.get("XSEG_MEMVIZ_CHECKER",
                             os.path.join(os.path.dirname(root), "shared", "tools", "memory-viz", "check-snapshot"))
    if not os.path.exists(checker):
        return None, "no memory-viz checker at %s (XSEG_MEMVIZ_CHECKER)" % checker
    deps = os.environ.get("MEMVIZ_DEPS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "xseg-memory-viz")
    here = os.path.dirname(checker)
    for f in ("_memory_viz.py", "MemoryViz.js"):
        if not any(os.path.exists(os.path.join(p, f)) for p in (here, os.path.join(deps, "pytorch"))):
            return None, "PyTorch's %s is not in %s/pytorch (see the checker's README)" % (f, deps)
    if not os.path.exists(os.path.join(deps, "vendor", "d3.js")):
        return None, "the checker's node dependencies are not set up in %s (its setup.sh)" % deps
    if not (os.environ.get("CHROMIUM") or any(os.access(os.path.join(p, "chromium"), os.X_OK)
                                              for p in os.environ.get("PATH", "").split(os.pathsep))):
        return None, "no Chromium"
    return checker, None


def main_stale(exe, memory_viz):
    checker = None
    if memory_viz:
        checker, why = memory_viz_checker()
        if not checker:
            print("SKIP: %s" % why)
            return 77
    with tempfile.TemporaryDirectory(prefix="xseg-stale-snap-") as tmp:
        r = subprocess.run([exe, tmp], capture_output=True, text=True)
        if r.returncode == 77:
            print("SKIP: %s" % r.stderr.strip())
            return 77
        assert r.returncode == 0, "test_stale_snapshot failed: %s%s" % (r.stdout, r.stderr)
        for mode in ("classic", "expandable"):
            name = "stale_" + mode
            path = os.path.join(tmp, name + ".pickle")
            d = load(path)
            nf, np_ = check_stale_snapshot(d, name)
            with open(os.path.join(tmp, name + ".json")) as f:
                j = json.load(f)
            assert untuple(d)["segments"] == j["segments"], "%s: JSON segments differ" % name
            assert untuple(d)["xseg_stale_accesses"] == j["xseg_stale_accesses"], name
            print("%s: %d findings, %d quarantined blocks: ok" % (name, nf, np_))
            if checker:
                shot = os.path.join(os.environ.get("XSEG_MEMVIZ_SHOTS") or tmp, name + ".png")
                r = subprocess.run([checker, path, shot], capture_output=True, text=True, timeout=400)
                last = (r.stdout.strip().splitlines() or [""])[-1]
                assert r.returncode == 0, "%s: check-snapshot failed:\n%s%s" % (name, r.stdout, r.stderr)
                print("%s: %s" % (name, last))
    return 0


def main():
    if sys.argv[1] == "--stale":
        return main_stale(sys.argv[2], "--memory-viz" in sys.argv[3:])
    exe = sys.argv[1]
    replay = sys.argv[2] if len(sys.argv) > 2 else None
    converter = sys.argv[3] if len(sys.argv) > 3 else None
    with tempfile.TemporaryDirectory(prefix="xseg-snap-") as tmp:
        r = subprocess.run([exe, "write", tmp], capture_output=True, text=True)
        if r.returncode == 77:
            print("SKIP: %s" % r.stderr.strip())
            return 77
        assert r.returncode == 0, "test_history write failed: %s%s" % (r.stdout, r.stderr)
        for name in ("expandable", "classic"):
            d = load(os.path.join(tmp, name + ".pickle"))
            nseg, nev = check_snapshot(d, name)
            with open(os.path.join(tmp, name + ".json")) as f:
                j = json.load(f)
            # The same data, except the snapshot events' own times and what changed in between.
            assert untuple(d)["segments"] == j["segments"], "%s: JSON segments differ" % name
            # Settings with their types: a float stays a float in JSON (0.0, not 0).
            typed = lambda o: {k: (type(v).__name__, v) for k, v in o.items()}
            assert typed(d["allocator_settings"]) == typed(j["allocator_settings"]), \
                "%s: JSON allocator_settings differ: %r != %r" % (
                    name, typed(d["allocator_settings"]), typed(j["allocator_settings"]))
            assert len(j["device_traces"][0]) >= len(d["device_traces"][0]) - 2
            print("%s: %d segments, %d events: ok" % (name, nseg, nev))
            if replay:
                trace = os.path.join(tmp, name + ".trace")
                r = subprocess.run([replay, trace], capture_output=True, text=True)
                assert r.returncode == 0, "xseg-replay %s: %s%s" % (trace, r.stdout, r.stderr)
                print("%s: the live-process log replays" % name)
        if replay and converter:
            check_replay_frames(replay, converter, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
