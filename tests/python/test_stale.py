"""debug_stale_access through the Python package (issue 50): seed 003's three cases played with
a graph replay on cudaemu (a tensor out of scope before the replay; `x = new` instead of
`x.copy_(new)`; a pinned CPU tensor of xseg's host cache freed under a captured H2D copy), each
reported with the allocation's and the free's Python frames with the mode on, and silently
corrupting another tensor with it off."""
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
                       ("cuMemcpyDtoDAsync_v2", [ctypes.c_uint64, ctypes.c_uint64, S, P]),
                       ("cuMemcpyHtoDAsync_v2", [ctypes.c_uint64, P, S, P]),
                       ("cuMemcpyDtoHAsync_v2", [P, ctypes.c_uint64, S, P]),
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


def set_mode(xseg, on, expandable=False, fill_batch=64):
    xseg.set_config("expandable_segments:%s,debug_stale_access:%s,debug_stale_fill_batch:%d"
                    % (expandable, on, fill_batch))
    xseg.record_memory_history(enabled="state", stacks="python")


def reset_mode(xseg):
    xseg.record_memory_history(enabled=None)
    xseg.set_config("expandable_segments:False,debug_stale_access:False,debug_stale_fill_batch:64")
    xseg.empty_cache()  # the quarantines (device and host) drain once the mode is off
    xseg.host_empty_cache()


def device_bytes(cu, p, n=N):
    buf = (ctypes.c_ubyte * n)()
    ok(cu.cuMemcpyDtoH_v2(buf, p, n))
    return bytes(buf)


def capture(cu, s, *ops):
    """Capture ops (callables each queueing one operation on stream s) into an executable graph."""
    ok(cu.cuStreamBeginCapture_v2(s, 2))
    for op in ops:
        ok(op())
    g, ex = ctypes.c_void_p(), ctypes.c_void_p()
    ok(cu.cuStreamEndCapture(s, ctypes.byref(g)))
    ok(cu.cuGraphInstantiateWithFlags(ctypes.byref(ex), g, 0))
    ok(cu.cuGraphDestroy(g))
    return ex


class Tensor:
    """A device tensor's lifetime as Python gives it: freed when its last reference goes, so
    `x = Tensor(...)` frees the old x (after the new one is allocated) at that very line."""

    def __init__(self, xseg, cu, s, value):
        self.free = xseg.free
        self.ptr = make_input(xseg, s.value)
        ok(cu.cuMemsetD8Async(self.ptr, value, N, s))

    def __del__(self):
        self.free(self.ptr)


REASSIGNMENT = "x = Tensor(xseg, cu, s, 0x44)"


def line_of(code):
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.strip().startswith(code))


def play_reassignment(xseg, cu, on, expandable=False, fill_batch=64):
    """The step reads its input x (y = f(x)) and then writes it in place (an accumulator's
    reset); the next input is given by `x = new` instead of `x.copy_(new)`, so the old x is freed
    while the graph still uses its address; another tensor takes memory and the graph replays."""
    set_mode(xseg, on, expandable, fill_batch)
    warm = xseg.malloc(512)  # makes the device's context current on this thread
    s = ctypes.c_void_p()
    ok(cu.cuStreamCreate(ctypes.byref(s), 1))
    x = Tensor(xseg, cu, s, 0x33)
    y = Tensor(xseg, cu, s, 0x00)
    ex = capture(cu, s, lambda: cu.cuMemcpyDtoDAsync_v2(y.ptr, x.ptr, N, s),
                 lambda: cu.cuMemsetD8Async(x.ptr, 0x11, N, s))
    old = x.ptr
    x = Tensor(xseg, cu, s, 0x44)  # wrong: x.copy_(new) keeps the address; this frees the old x
    other = Tensor(xseg, cu, s, 0x22)
    if fill_batch > 1:
        xseg.stale_flush()  # the fills waiting for their batch go before a replay (as xseg.torch does)
    ok(cu.cuGraphLaunch(ex, s))
    ok(cu.cuStreamSynchronize(s))
    got = {"read": device_bytes(cu, y.ptr), "other": device_bytes(cu, other.ptr),
           "new": device_bytes(cu, x.ptr), "other_ptr": other.ptr, "new_ptr": x.ptr}
    found = xseg.check_stale()
    ok(cu.cuGraphExecDestroy(ex))
    del x, y, other
    xseg.free(warm)
    ok(cu.cuStreamDestroy_v2(s))
    reset_mode(xseg)
    return old, got, found


REASSIGN = [pytest.param(False, 64, id="classic-flush"), pytest.param(True, 64, id="expandable-flush"),
            pytest.param(False, 1, id="classic-fill-at-free")]


@pytest.mark.parametrize("expandable,fill_batch", REASSIGN)
def test_reassignment_reported_with_both_stacks(xseg, expandable, fill_batch):
    cu = _driver()
    reports = []
    xseg.attach_stale_observer(reports.append)
    old, got, found = play_reassignment(xseg, cu, True, expandable, fill_batch)
    assert got["other_ptr"] != old and got["new_ptr"] != old  # the old x is quarantined
    assert set(got["read"]) == {0xFF}  # the replay read poison (NaN), never another tensor's data
    assert set(got["other"]) == {0x22} and set(got["new"]) == {0x44}
    assert found == 1 and len(reports) == 1
    r = reports[0]
    assert r["address"] == old and r["size"] == N and r["pool"] == "large"
    assert r["expandable"] == expandable and r["when"] == "xseg_check_stale"
    assert [f["name"] for f in r["alloc_frames"][:2]] == ["make_input", "__init__"]
    freed = r["free_frames"][1]  # under __del__: the reassignment's line
    assert r["free_frames"][0]["name"] == "__del__" and freed["name"] == "play_reassignment"
    assert freed["filename"].endswith("test_stale.py") and freed["line"] == line_of(REASSIGNMENT)
    assert "was written after its free" in r["message"]


@pytest.mark.parametrize("expandable", [False, True], ids=["classic", "expandable"])
def test_reassignment_corrupts_silently_when_off(xseg, expandable):
    cu = _driver()
    reports = []
    xseg.attach_stale_observer(reports.append)
    old, got, found = play_reassignment(xseg, cu, False, expandable)
    assert got["other_ptr"] == old  # another tensor took the old x's memory
    assert set(got["read"]) == {0x22}  # the replay read that tensor's data, not the new input's
    assert set(got["other"]) == {0x11}  # and overwrote it
    assert found == 0 and reports == []


def make_pinned(xseg, n):
    return xseg.host_malloc(n)


def cpu_tensor_collected(xseg, p):
    xseg.host_free(p)


def play_host_copy(xseg, cu, on):
    """The step copies a pinned CPU tensor to the device (static_x.copy_(x_cpu,
    non_blocking=True)) and its result back into it (x_cpu.copy_(out, non_blocking=True)); the
    CPU tensor is then collected while the graph lives, the next pinned tensor takes host memory
    and the graph replays."""
    set_mode(xseg, on)
    s = ctypes.c_void_p()
    dev = xseg.malloc(N)  # static_x (and the device's context current on this thread)
    out = xseg.malloc(N)  # the step's result
    ok(cu.cuStreamCreate(ctypes.byref(s), 1))
    cpu = make_pinned(xseg, N)
    ctypes.memset(cpu, 0x11, N)
    ex = capture(cu, s, lambda: cu.cuMemcpyHtoDAsync_v2(dev, cpu, N, s),
                 lambda: cu.cuMemsetD8Async(out, 0x55, N, s),
                 lambda: cu.cuMemcpyDtoHAsync_v2(cpu, out, N, s))
    cpu_tensor_collected(xseg, cpu)
    other = xseg.host_malloc(N)  # the next pinned tensor
    ctypes.memset(other, 0x22, N)
    ok(cu.cuGraphLaunch(ex, s))
    ok(cu.cuStreamSynchronize(s))
    got = {"device": device_bytes(cu, dev), "other": ctypes.string_at(other, N), "other_ptr": other}
    found = xseg.check_stale()
    ok(cu.cuGraphExecDestroy(ex))
    xseg.host_free(other)
    xseg.free(out)
    xseg.free(dev)
    ok(cu.cuStreamDestroy_v2(s))
    reset_mode(xseg)
    return cpu, got, found


def test_freed_cpu_tensor_under_h2d_reported_with_both_stacks(xseg):
    cu = _driver()
    reports = []
    xseg.attach_stale_observer(reports.append)
    cpu, got, found = play_host_copy(xseg, cu, True)
    assert got["other_ptr"] != cpu  # the freed pinned block is quarantined
    assert set(got["device"]) == {0xFF}  # the device got poison (NaN), not the next tensor's data
    assert set(got["other"]) == {0x22}
    assert found == 1 and len(reports) == 1
    r = reports[0]
    assert r["address"] == cpu and r["size"] >= N and r["pool"] == "host" and r["device"] == -1
    assert r["first_offset"] == 0 and r["stream"] == 0
    assert r["alloc_frames"][0]["name"] == "make_pinned"
    assert r["free_frames"][0]["name"] == "cpu_tensor_collected"
    assert r["free_frames"][0]["filename"].endswith("test_stale.py")
    assert "stale access in pinned host memory" in r["message"]


def test_freed_cpu_tensor_under_h2d_corrupts_silently_when_off(xseg):
    cu = _driver()
    reports = []
    xseg.attach_stale_observer(reports.append)
    cpu, got, found = play_host_copy(xseg, cu, False)
    assert got["other_ptr"] == cpu  # the next pinned tensor took the freed block
    assert set(got["device"]) == {0x22}  # the device received that tensor's data
    assert set(got["other"]) == {0x55}  # and the replay's D2H copy overwrote it
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
