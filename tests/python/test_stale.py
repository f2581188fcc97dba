"""debug_stale_access through the Python package (issue 50): seed 003's "tensor out of scope
before replay" played with a graph replay on cudaemu, reported with the allocation's and the
free's Python frames with the mode on, and silently corrupting another tensor with it off."""
import ctypes
import os

import pytest

N = 3 << 20


def _driver():
    path = os.environ.get("XSEG_LIBCUDA")
    if not path or "cudaemu" not in path:
        pytest.skip("needs cudaemu (XSEG_LIBCUDA): the test replays a graph through driver calls")
    cu = ctypes.CDLL(path)
    P, S = ctypes.c_void_p, ctypes.c_size_t
    for name, args in [("cuStreamCreate", [ctypes.POINTER(P), ctypes.c_uint]),
                       ("cuStreamDestroy_v2", [P]),
                       ("cuStreamSynchronize", [P]),
                       ("cuStreamBeginCapture_v2", [P, ctypes.c_int]),
                       ("cuStreamEndCapture", [P, ctypes.POINTER(P)]),
                       ("cuGraphInstantiateWithFlags", [ctypes.POINTER(P), P, ctypes.c_ulonglong]),
                       ("cuGraphLaunch", [P, P]),
                       ("cuGraphDestroy", [P]),
                       ("cuGraphExecDestroy", [P]),
                       ("cuMemsetD8Async", [ctypes.c_uint64, ctypes.c_ubyte, S, P]),
                       ("cuMemcpyDtoH_v2", [P, ctypes.c_uint64, S])]:
        fn = getattr(cu, name, None)
        if fn is None:
            pytest.skip("the driver lacks " + name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return cu


def ok(r):
    assert r == 0, "driver call failed: %d" % r


def make_input(xseg, s):
    return xseg.malloc(N, stream=s)


def input_out_of_scope(xseg, p):
    xseg.free(p)


def play(xseg, cu, on):
    """The step writes its input in place (a captured memset); the input is then freed while the
    graph lives, another tensor takes memory, and the graph replays."""
    xseg.set_config("expandable_segments:False,debug_stale_access:%s" % ("True" if on else "False"))
    xseg.record_memory_history(enabled="state", stacks="python")
    warm = xseg.malloc(512)  # makes the device's context current on this thread
    s = ctypes.c_void_p()
    ok(cu.cuStreamCreate(ctypes.byref(s), 1))
    x = make_input(xseg, s.value)
    ok(cu.cuStreamBeginCapture_v2(s, 2))
    ok(cu.cuMemsetD8Async(x, 0x11, N, s))
    g, ex = ctypes.c_void_p(), ctypes.c_void_p()
    ok(cu.cuStreamEndCapture(s, ctypes.byref(g)))
    ok(cu.cuGraphInstantiateWithFlags(ctypes.byref(ex), g, 0))
    ok(cu.cuGraphDestroy(g))
    input_out_of_scope(xseg, x)
    other = xseg.malloc(N, stream=s.value)
    ok(cu.cuMemsetD8Async(other, 0x22, N, s))
    xseg.stale_flush()  # the fills waiting for their batch go before a replay (as xseg.torch does)
    ok(cu.cuGraphLaunch(ex, s))
    ok(cu.cuStreamSynchronize(s))
    buf = (ctypes.c_ubyte * N)()
    ok(cu.cuMemcpyDtoH_v2(buf, other, N))
    intact = all(b == 0x22 for b in bytes(buf[:4096]))
    found = xseg.check_stale()
    ok(cu.cuGraphExecDestroy(ex))
    xseg.free(other)
    xseg.free(warm)
    ok(cu.cuStreamDestroy_v2(s))
    xseg.record_memory_history(enabled=None)
    xseg.set_config("debug_stale_access:False")
    xseg.empty_cache()  # the quarantine drains once the mode is off
    return x, other, intact, found


def test_out_of_scope_reported_with_both_stacks(xseg):
    cu = _driver()
    reports = []
    xseg.attach_stale_observer(reports.append)
    x, other, intact, found = play(xseg, cu, True)
    assert other != x and intact
    assert found == 1 and len(reports) == 1
    r = reports[0]
    assert r["address"] == x and r["size"] == N and r["pool"] == "large" and not r["expandable"]
    assert r["first_offset"] == 0 and r["when"] == "xseg_check_stale"
    assert r["alloc_frames"][0]["name"] == "make_input"
    assert r["free_frames"][0]["name"] == "input_out_of_scope"
    assert r["alloc_frames"][0]["filename"].endswith("test_stale.py")
    assert "was written after its free" in r["message"]


def test_out_of_scope_corrupts_silently_when_off(xseg):
    cu = _driver()
    reports = []
    xseg.attach_stale_observer(reports.append)
    x, other, intact, found = play(xseg, cu, False)
    assert other == x and not intact  # the replay overwrote another tensor
    assert found == 0 and reports == []


def test_stale_flush_fills_the_waiting_blocks(xseg):
    """A freed block keeps its bytes until its batch (debug_stale_fill_batch) is full or
    stale_flush fills it."""
    cu = _driver()
    xseg.set_config("expandable_segments:False,debug_stale_access:True,debug_stale_fill_batch:8")
    try:
        p = xseg.malloc(1 << 20)
        ok(cu.cuMemsetD8Async(p, 0x3c, 1 << 20, None))
        xseg.free(p)
        one = (ctypes.c_ubyte * 1)()

        def first_byte():
            ok(cu.cuStreamSynchronize(None))
            ok(cu.cuMemcpyDtoH_v2(one, p, 1))
            return one[0]
        assert first_byte() == 0x3c  # waiting: its old bytes, still quarantined
        xseg.stale_flush()
        assert first_byte() == 0xFF
        xseg.stale_flush(0)  # nothing waits: nothing done
    finally:
        xseg.set_config("debug_stale_access:False,debug_stale_fill_batch:64")
        xseg.empty_cache()


class _FakeGraph:
    """Stands for torch.cuda.CUDAGraph (no CUDA PyTorch here): replay records its call."""
    calls = []

    def replay(self):
        self.calls.append("replay")


def test_torch_replays_flush_first(xseg, monkeypatch):
    """xseg.torch.watch_graph_replays (enable(debug_stale_access=True) calls it) makes every
    CUDAGraph.replay call stale_flush first. The real PyTorch check runs in the GPU acceptance
    run (benchmarks/gpu/torch_checks.py's torch group)."""
    import types
    import xseg.torch as xt
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(CUDAGraph=_FakeGraph))
    monkeypatch.setattr(_FakeGraph, "replay", _FakeGraph.replay)  # restored after the test
    monkeypatch.setattr(xseg, "stale_flush", lambda device=None: _FakeGraph.calls.append("flush"))
    xt.watch_graph_replays(fake)
    xt.watch_graph_replays(fake)  # idempotent: one flush a replay
    _FakeGraph.calls.clear()
    _FakeGraph().replay()
    _FakeGraph().replay()
    assert _FakeGraph.calls == ["flush", "replay", "flush", "replay"]


def test_bad_arguments(xseg):
    with pytest.raises(xseg.XsegError, match="debug_quarantine_mb"):
        xseg.set_config("debug_quarantine_mb:0")
    with pytest.raises(ValueError):
        xseg.check_stale("cpu")
    with pytest.raises(xseg.XsegError, match="debug_stale_fill_batch"):
        xseg.set_config("debug_stale_fill_batch:0")
    with pytest.raises(ValueError):
        xseg.stale_flush("cpu")
    with pytest.raises(xseg.XsegError):
        xseg.stale_flush(7)
