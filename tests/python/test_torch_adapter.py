"""xseg.torch.enable() under real PyTorch: runs only where a CUDA build of PyTorch and a GPU are
present (the adapter compiles against PyTorch's C++ headers and runs on the real driver, never on
cudaemu); skipped with the reason elsewhere.

One training script (torch_adapter_script.py) runs twice, each in a fresh process: on PyTorch's
own allocator and on xseg through the adapter. The training loop prefetches batches on a copy
stream and reduces gradients on a communication stream, with record_stream on both sides; its
losses and final parameters must agree bit for bit. The xseg run then exercises, each on its own
so one failure does not hide the others: memory_stats()/memory_summary() and the resets through
torch, cuDNN's benchmark mode (cacheInfo), torch.cuda.graph capture and replay in a private pool,
torch.cuda.MemPool (where this PyTorch has it), a snapshot with history dumped by
torch.cuda.memory._dump_snapshot, and an allocation too large for the device, which must raise
torch.cuda.OutOfMemoryError with xseg's message naming the OOM snapshot. With
XSEG_CHECK_SNAPSHOT naming a snapshot checker (a program taking SNAPSHOT.pickle
SCREENSHOT.png), the dumped snapshot is also rendered by it.
"""
import json
import os
import pickle
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "..", "python")
SCRIPT = os.path.join(HERE, "torch_adapter_script.py")


def torch_reason():
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if torch.version.cuda is None:
        return "this PyTorch has no CUDA support"
    if not torch.cuda.is_available():
        return "no CUDA device (the adapter runs against the real driver, not cudaemu)"
    return None


pytestmark = pytest.mark.skipif(torch_reason() is not None, reason=str(torch_reason()))


def run(mode, out):
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XSEG_LIBCUDA", None)  # PyTorch and xseg must share the real driver
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS for the bit-for-bit check
    r = subprocess.run([sys.executable, SCRIPT, mode, str(out)], env=env, capture_output=True, text=True,
                       timeout=900)
    return r


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for mode in ("native", "xseg"):
        d = tmp_path_factory.mktemp(mode)
        r = run(mode, d)
        assert r.returncode == 0, "%s run failed:\n%s\n%s" % (mode, r.stdout[-4000:], r.stderr[-8000:])
        with open(d / "report.json") as f:
            report = json.load(f)
        out[mode] = {"dir": d, "report": report, "stderr": r.stderr}
    return out


def check(runs, name):
    result = runs["xseg"]["report"][name]
    if result.startswith("skip:"):
        pytest.skip(result[5:].strip())
    assert result == "ok", result


def test_training_loop_bit_for_bit(runs):
    import torch
    a = torch.load(runs["native"]["dir"] / "train.pt")
    b = torch.load(runs["xseg"]["dir"] / "train.pt")
    assert runs["native"]["report"]["allocator"] != "xseg"
    assert runs["xseg"]["report"]["allocator"] == "xseg"
    assert a["losses"].numel() == b["losses"].numel() > 0
    assert torch.equal(a["losses"], b["losses"]), (a["losses"], b["losses"])
    assert len(a["params"]) == len(b["params"])
    for pa, pb in zip(a["params"], b["params"]):
        assert torch.equal(pa, pb)
    # record_stream reached xseg: the adapter wires the hook, so the bare-allocator warning is silent
    assert "xseg: warning" not in runs["xseg"]["stderr"]


def test_memory_stats_and_summary(runs):
    check(runs, "stats")


def test_resets(runs):
    check(runs, "resets")


def test_cudnn_benchmark_cache_info(runs):
    check(runs, "cache_info")


def test_graph_capture_and_replay(runs):
    check(runs, "graph")


def test_mempool(runs):
    check(runs, "mempool")


def test_out_of_memory_raises(runs):
    check(runs, "oom")


def test_snapshot_dump(runs):
    check(runs, "snapshot")
    with open(runs["xseg"]["dir"] / "snapshot.pickle", "rb") as f:
        snap = pickle.load(f)
    assert snap["segments"] and snap["device_traces"]
    checker = os.environ.get("XSEG_CHECK_SNAPSHOT")
    if checker:
        png = runs["xseg"]["dir"] / "snapshot.png"
        r = subprocess.run([checker, str(runs["xseg"]["dir"] / "snapshot.pickle"), str(png)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
