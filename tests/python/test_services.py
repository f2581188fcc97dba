"""Giving cached memory back from Python: trim, sleep and wake."""
import ctypes
import os

import pytest

from devmem import driver as _driver, read as _read, write as _write

MiB = 1 << 20


def cached(x):
    return x.memory_reserved(0) - x.memory_allocated(0)


def test_trim_keeps_at_most_what_is_asked(xseg):
    ps = [xseg.malloc(20 * MiB) for _ in range(6)]
    keep = ps[1]
    for p in ps:
        if p != keep:
            xseg.free(p)
    try:
        assert cached(xseg) >= 80 * MiB
        xseg.trim(40 * MiB, 0)
        assert cached(xseg) <= 40 * MiB
        assert xseg.memory_allocated(0) >= 20 * MiB  # the live block stays
        xseg.trim()
        assert cached(xseg) < 20 * MiB
    finally:
        xseg.free(keep)


def test_trim_arguments(xseg):
    with pytest.raises(ValueError):
        xseg.trim(-1)
    with pytest.raises(TypeError):
        xseg.trim(1.5)
    with pytest.raises(xseg.XsegError) as ei:
        xseg.trim(0, 99)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_DEVICE"


# --- sleep and wake ---------------------------------------------------------------------------


@pytest.fixture
def awake(xseg):
    """Make sure no pool is left asleep for the next test."""
    yield xseg
    if xseg.sleep_stats(xseg.DEFAULT_POOL)["asleep"]:
        xseg.wake()


def test_sleep_offload_and_wake(awake):
    x = awake
    data = bytes(range(256)) * 4096  # 1 MiB
    live = x.malloc(30 * MiB)
    cached_block = x.malloc(40 * MiB)
    _write(live, data)
    x.free(cached_block)
    reserved = x.memory_reserved(0)
    try:
        x.sleep()
        assert x.memory_reserved(0) == 0  # every page given back, live and cached
        st = x.sleep_stats(x.DEFAULT_POOL)
        assert st["asleep"] == 1 and st["offload"]
        assert st["released_bytes"] == reserved
        assert st["offloaded_bytes"] == 30 * MiB
        assert x.sleep_stats()["asleep"] == 1  # the whole device
        with pytest.raises(x.XsegError) as ei:
            x.malloc(MiB)
        assert ei.value.status_name == "XSEG_ERROR_ILLEGAL_STATE"
        assert "asleep" in str(ei.value)
        with pytest.raises(x.XsegError):
            x.sleep()  # twice
    finally:
        x.wake()
    assert x.memory_reserved(0) == reserved
    assert _read(live, len(data)) == data  # same address, same bytes
    st = x.sleep_stats(x.DEFAULT_POOL)
    assert st["asleep"] == 0 and st["num_wakes"] >= 1
    with pytest.raises(x.XsegError) as ei:
        x.wake()  # not asleep
    assert ei.value.status_name == "XSEG_ERROR_ILLEGAL_STATE"
    x.free(live)


def test_sleep_discard_reads_zero(awake):
    x = awake
    live = x.malloc(MiB)
    _write(live, b"\xab" * MiB)
    x.sleep(offload=False)
    assert x.sleep_stats(x.DEFAULT_POOL)["discarded_bytes"] == MiB
    x.free(live)  # freeing while asleep works
    x.wake()
    assert _read(live, MiB) == bytes(MiB)  # its pages read zero (the block is free now)


def test_sleep_to_file(awake, tmp_path):
    x = awake
    data = bytes(range(256)) * 4096 * 3  # 3 MiB
    live = x.malloc(len(data))
    _write(live, data)
    path = tmp_path / "pool.bin"
    x.sleep(path=path)
    try:
        assert path.stat().st_size == len(data) and (path.stat().st_mode & 0o777) == 0o600
        st = x.sleep_stats(x.DEFAULT_POOL)
        assert st["asleep"] == 1 and st["offload"] and st["to_file"]
        assert st["offloaded_bytes"] == len(data)
        assert x.memory_reserved(0) == 0
    finally:
        x.wake()
    assert not path.exists()  # the wake removed it
    assert _read(live, len(data)) == data
    # a planted link and an existing file are refused; the pool stays awake with its bytes
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    path.symlink_to(victim)
    with pytest.raises(x.XsegError) as ei:
        x.sleep(path=str(path))
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE" and "refusing" in str(ei.value)
    assert victim.read_bytes() == b"keep" and x.sleep_stats(x.DEFAULT_POOL)["asleep"] == 0
    with pytest.raises(x.XsegError):
        x.sleep(path=bytes(victim))
    with pytest.raises(ValueError):
        x.sleep(path=path, offload=False)
    with pytest.raises(ValueError):
        x.sleep(path="")
    with pytest.raises(TypeError):
        x.sleep(path=5)
    assert _read(live, len(data)) == data
    x.free(live)


def test_sleep_arguments(awake):
    x = awake
    with pytest.raises(TypeError):
        x.sleep(pool=5)
    with pytest.raises(ValueError):
        x.sleep(pool=(1, -1))
    with pytest.raises(x.XsegError) as ei:
        x.sleep(pool=(12345, 678))  # a pool this device does not know
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"
    with pytest.raises(x.XsegError) as ei:
        x.wake(device=99)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_DEVICE"

    class MemPoolLike:  # torch.cuda.MemPool has an .id pair
        id = (12345, 678)
    with pytest.raises(x.XsegError):
        x.sleep_stats(MemPoolLike())


# --- sleep and wake by tag --------------------------------------------------------------------

def _private_pool(x, size, data):
    """A private pool (xseg_pool_create + allocate-to-pool, as a torch.cuda.MemPool is) holding one
    block of `size` bytes that starts with `data`: (pool id pair, block)."""
    lib = x._lib.lib()
    pid = x._lib.PoolId()
    x._lib.check(x._lib.need("xseg_pool_create")(ctypes.byref(pid)))
    begin, end = lib.xseg_begin_allocate_to_pool, lib.xseg_end_allocate_to_pool
    begin.argtypes = [ctypes.c_int, x._lib.PoolId, ctypes.c_void_p, ctypes.c_void_p]
    end.argtypes = [ctypes.c_int, x._lib.PoolId]
    assert begin(0, pid, None, None) == 0
    try:
        p = x.malloc(size)
    finally:
        assert end(0, pid) == 0
    _write(p, data)
    return (pid.first, pid.second), p


def test_sleep_by_tag(awake):
    """vLLM's level 1 over tags: the weights offloaded, the KV cache discarded; the weights woken
    first, then the rest. The untagged pool (here the default pool) is never touched."""
    x = awake
    w_data, kv_data, other = b"\x11" * MiB, b"\x22" * MiB, b"\x33" * MiB
    pw, w = _private_pool(x, 2 * MiB, w_data)
    pk, kv = _private_pool(x, 3 * MiB, kv_data)
    act = x.malloc(MiB)
    _write(act, other)
    x.set_pool_tag(pw, "weights")
    x.set_pool_tag(pk, "kv_cache")
    assert x.pool_tag(pw) == "weights" and x.pool_tag(x.DEFAULT_POOL) is None
    x.sleep(tags=["weights", "kv_cache"], offload=["weights"])
    try:
        assert x.sleep_stats(pw)["asleep"] == 1 and x.sleep_stats(pw)["offload"]
        assert x.sleep_stats(pk)["asleep"] == 1 and not x.sleep_stats(pk)["offload"]
        assert x.sleep_stats(pk)["discarded_bytes"] == 3 * MiB
        assert x.sleep_stats(x.DEFAULT_POOL)["asleep"] == 0
        assert _read(act, MiB) == other
        x.wake(tags="weights")
        assert _read(w, MiB) == w_data
        assert x.sleep_stats(pk)["asleep"] == 1
    finally:
        x.wake(tags=["kv_cache", "weights"])  # the awake weights are left alone
    assert _read(kv, MiB) == bytes(MiB)
    with pytest.raises(x.XsegError) as ei:
        x.wake(tags=["kv_cache"])
    assert ei.value.status_name == "XSEG_ERROR_ILLEGAL_STATE"
    # level 2: everything discarded
    x.sleep(tags=("weights", "kv_cache"), offload=False)
    assert x.sleep_stats(pw)["discarded_bytes"] == 2 * MiB
    x.wake(tags=("weights", "kv_cache"))
    assert _read(w, MiB) == bytes(MiB)
    for p in (w, kv, act):
        x.free(p)
    x.set_pool_tag(pw, None)
    assert x.pool_tag(pw) is None
    for pid in (pw, pk):
        x._lib.check(x._lib.need("xseg_release_pool")(0, x._lib.PoolId(*pid)))


def test_sleep_by_tag_arguments(awake):
    x = awake
    x.set_pool_tag(x.DEFAULT_POOL, "weights")
    try:
        with pytest.raises(x.XsegError) as ei:
            x.set_pool_tag(x.DEFAULT_POOL, "kv cache")
        assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE" and "other than letters" in str(ei.value)
        with pytest.raises(TypeError):
            x.set_pool_tag(x.DEFAULT_POOL, 5)
        with pytest.raises(ValueError):
            x.set_pool_tag(x.DEFAULT_POOL, "a\0b")
        with pytest.raises(ValueError, match="offload names"):
            x.sleep(tags=["weights"], offload=["kv_cache"])
        with pytest.raises(ValueError, match="no pool or path"):
            x.sleep(pool=(1, 2), tags=["weights"])
        with pytest.raises(ValueError, match="no pool or path"):
            x.sleep(tags=["weights"], path="/tmp/x")
        with pytest.raises(ValueError, match="empty"):
            x.sleep(tags=[])
        with pytest.raises(TypeError):
            x.sleep(tags=["weights"], offload=3)
        with pytest.raises(x.XsegError) as ei:
            x.sleep(tags=["weights", "kv_cache"])  # kv_cache: no pool carries it
        assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE" and "its tags: 'weights'" in str(ei.value)
        assert x.sleep_stats(x.DEFAULT_POOL)["asleep"] == 0  # nothing slept
        with pytest.raises(x.XsegError) as ei:
            x.wake(tags="weights")
        assert ei.value.status_name == "XSEG_ERROR_ILLEGAL_STATE"
        with pytest.raises(x.XsegError) as ei:
            x.wake(tags=["weights", "weights"])
        assert "given twice" in str(ei.value)
    finally:
        x.set_pool_tag(x.DEFAULT_POOL, None)


# --- pinned host memory -----------------------------------------------------------------------

def test_host_malloc_reuse_and_stats(xseg):
    xseg.host_empty_cache()  # the backups earlier sleeps kept (sleep_keep_host_backup) go first
    before = xseg.host_memory_stats()
    assert "num_host_alloc" in before and "host_alloc_time.avg" in before
    p = xseg.host_malloc(100 * MiB + 1)
    try:
        ctypes.memset(p, 0x5A, 100 * MiB + 1)  # host memory: writable from the CPU
        st = xseg.host_memory_stats()
        assert st["reserved_bytes.current"] - before["reserved_bytes.current"] == 102 * MiB  # not 128
        assert st["allocation.current"] == before["allocation.current"] + 1
    finally:
        xseg.host_free(p)
    q = xseg.host_malloc(100 * MiB)  # the cached block again, no new segment
    assert q == p
    assert xseg.host_memory_stats()["num_host_alloc"] == st["num_host_alloc"]
    xseg.host_record_stream(q, 0)
    xseg.host_free(q)
    xseg.host_empty_cache()
    assert xseg.host_memory_stats()["reserved_bytes.current"] == before["reserved_bytes.current"]


def test_host_stats_resets(xseg):
    p = xseg.host_malloc(3 * MiB)
    xseg.host_free(p)
    assert xseg.host_memory_stats()["allocated_bytes.peak"] >= 3 * MiB
    xseg.host_reset_peak_stats()
    st = xseg.host_memory_stats()
    assert st["allocated_bytes.peak"] == st["allocated_bytes.current"]
    assert st["num_host_alloc"] > 0
    xseg.host_reset_accumulated_stats()
    st = xseg.host_memory_stats()
    assert st["num_host_alloc"] == 0 and st["allocation.allocated"] == 0 and st["host_alloc_time.count"] == 0


def test_torch_pinned_status_without_enable():
    """xseg.torch says why pinned tensors are not xseg's before enable() (no torch needed), and
    enable() refuses a pinned= that is not a bool before touching torch."""
    import xseg.torch as xt
    assert xt.pinned_installed() is False
    assert "enable()" in xt.pinned_reason()
    with pytest.raises(TypeError, match="pinned must be True or False"):
        xt.enable(pinned="yes")
    assert not xt.is_enabled()


def test_host_errors(xseg):
    with pytest.raises(xseg.XsegError) as ei:
        xseg.host_free(12345)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"
    assert "host allocator" in str(ei.value)
    with pytest.raises(ValueError):
        xseg.host_malloc(-1)
    with pytest.raises(xseg.XsegError) as ei:
        xseg.host_record_stream(12345, None)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"
    xseg.host_free(None)
    xseg.host_free(xseg.host_malloc(10))


# --- the guide's inference-server recipe --------------------------------------------------------

def _guide_server_config():
    """The config docs/guide.md's inference-server section starts from (read from the guide, so the
    test follows the docs), and the cache it promises stays ("N GiB of cache stays")."""
    import re
    guide = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "guide.md")
    with open(guide, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Inference servers"):]
    section = section[:section.index("\n## ", 1)]
    cfg = re.search(r'xseg\.torch\.enable\("([^"]+)"\)', section).group(1)
    promise = re.search(r"(\d+) GiB of\s+cache stays for the next burst", section)
    assert promise, "the guide's inference-server sentence changed: update this test"
    return cfg, int(promise.group(1)) << 30


def test_inference_server_recipe_keeps_its_cache(xseg):
    """release_threshold_mb with idle release: a burst's cache goes back once idle down to the
    threshold, which stays for the next burst (before: idle release gave back everything)."""
    import time
    cfg, keep = _guide_server_config()
    assert "release_threshold_mb" in cfg and "idle_release_ms" in cfg
    # README's Quick start shows the service owner the same settings, from C and from PyTorch.
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        quick = f.read().split("## Quick start")[1].split("\n## ")[0]
    assert 'xseg_init("%s");' % cfg in quick and 'xseg.torch.enable("%s")' % cfg in quick
    idle_ms = int(cfg.split("idle_release_ms:")[1].split(",")[0])
    before = xseg.get_config()
    xseg.set_config(cfg)
    try:
        burst = [xseg.malloc(64 * MiB) for _ in range(keep * 2 // (64 * MiB))]
        for p in burst:
            xseg.free(p)
        freed = time.monotonic()
        assert cached(xseg) >= 2 * keep - 64 * MiB
        deadline = freed + idle_ms / 1000 * 3 + 10
        while cached(xseg) > keep and time.monotonic() < deadline:
            time.sleep(0.1)
        # Past the idle window (runs go between T and 1.25 T after their last use), and more
        # ticks: what stays, stays.
        time.sleep(max(0.0, freed + idle_ms / 1000 * 1.5 + 0.5 - time.monotonic()))
        got = cached(xseg)
        assert keep - 20 * MiB < got <= keep, "cache %d MiB after idle, the guide promises %d" % (
            got >> 20, keep >> 20)
    finally:
        # release_threshold_mb is kept when a string omits it, and its unset value is not spelled
        # in get_config(): unset it by that value.
        xseg.set_config(before + ("" if "release_threshold_mb" in before else ",release_threshold_mb:17592186044415"))
        assert xseg.get_config() == before
        xseg.empty_cache()
