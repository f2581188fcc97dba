"""xseg.compat on cudaemu, over the torch-less backend (xseg's own private pools, xseg.malloc):
the assertions of the two projects' own tests, kept (not their text), plus the behaviour each
project defines at the edges. The same tests through PyTorch on a GPU:
tests/python/compat_torch_script.py (benchmarks/gpu/torch_checks.py runs it).

Ported from
- fzyzcjy/torch_memory_saver at 4a43c97771f139db0215c1378e8a0b50e679d23d: test/examples/simple.py
  (pause gives the region's memory back, resume takes it again, the address stays),
  cpu_backup.py (backup regions keep their bytes, the others do not; tags are independent),
  nested_region.py (a region inside another allocates to its own tag and backup setting),
  cuda_graph.py (pausing one tag frees its memory and leaves the rest usable);
- vllm-project/vllm tests/basic_correctness/test_cumem.py at
  04a070dc088c6cd86299a19dab64195ed8e209a8: test_basic_cumem (pool memory beside default memory,
  sleep frees device memory, wake_up restores the default tag's bytes), test_cumem_with_cudagraph
  (the default tag kept, the "discard" tag discarded), test_python_error (a wake_up without the
  memory raises RuntimeError)."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from devmem import driver as _driver, read as _read, write as _write

MiB = 1 << 20
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

_POOL_OF = {}  # ptr -> pool, remembered: a sleeping pool's segments leave the snapshot


def _pool_of(x, ptr):
    if ptr in _POOL_OF:
        return _POOL_OF[ptr]
    for s in x.memory_snapshot(0):
        if s["address"] <= ptr < s["address"] + s["total_size"]:
            _POOL_OF[ptr] = tuple(s["segment_pool_id"])
            return _POOL_OF[ptr]
    raise AssertionError("0x%x is in no segment (or its pool sleeps)" % ptr)


def _free(x):
    return x.mem_get_info(0)[0]


def _uses(x, pool):
    """xseg_pool_use_count: a region's pool keeps one use however often it is entered."""
    n = ctypes.c_int(-1)
    f = x._lib.need("xseg_pool_use_count")
    f.argtypes = [ctypes.c_int, x._lib.PoolId, ctypes.POINTER(ctypes.c_int)]
    x._lib.check(f(0, x._lib.PoolId(*pool), ctypes.byref(n)))
    return n.value


@pytest.fixture
def env(xseg):
    """(xseg, a fresh TorchMemorySaver, a fresh CuMemAllocator, ptrs to free), both over the
    xseg backend. Teardown wakes what sleeps and untags their pools, so that the next test's
    pools are the only ones carrying its tags."""
    from xseg.compat._backend import XsegBackend
    from xseg.compat.torch_memory_saver import TorchMemorySaver
    from xseg.compat.vllm import CuMemAllocator
    tms, cumem, ptrs = TorchMemorySaver(backend=XsegBackend()), CuMemAllocator(backend=XsegBackend()), []
    xseg.empty_cache()
    reserved = xseg.memory_reserved(0)
    yield xseg, tms, cumem, ptrs
    xseg.set_per_process_memory_fraction(1.0, 0)
    for (device, xtag) in list(tms._paused):
        xseg.wake(tags=[xtag], device=device)
    if cumem._asleep:
        cumem.wake_up()
    for p in ptrs:
        xseg.free(p)
    for pool in list(tms._pools.values()) + [p for _x, p in cumem._pools.values()]:
        xseg.set_pool_tag(pool, None)
        if isinstance(pool, tuple):  # the xseg backend's (torch_env releases its own)
            XsegBackend().release_pool(pool, 0)
    _POOL_OF.clear()
    xseg.empty_cache()
    # Nothing of this test stays for the next ones (of this file or test_services.py's).
    assert xseg.memory_reserved(0) <= reserved


# --- torch_memory_saver --------------------------------------------------------------------------

def test_tms_region_allocates_to_its_tagged_pool(env):
    x, tms, _, ptrs = env
    outside = x.malloc(MiB)
    ptrs.append(outside)
    with tms.region(tag="weights", enable_cpu_backup=True):
        w = x.malloc(2 * MiB)
        with tms.region(tag="grad_buffer"):  # nested_region.py: the inner region's own tag
            g = x.malloc(2 * MiB)
        w2 = x.malloc(2 * MiB)  # back in the outer region
    ptrs += [w, g, w2]
    pw, pg = _pool_of(x, w), _pool_of(x, g)
    assert pw != pg and _pool_of(x, w2) == pw and _pool_of(x, outside) == (0, 0)
    assert x.pool_tag(pw) == "tms.weights.cpu" and x.pool_tag(pg) == "tms.grad_buffer"
    with tms.region():  # the default tag
        d = x.malloc(MiB)
    ptrs.append(d)
    assert x.pool_tag(_pool_of(x, d)) == "tms.default"
    with tms.region(tag="weights", enable_cpu_backup=True):  # the same (tag, backup): the same pool
        w3 = x.malloc(MiB)
    ptrs.append(w3)
    assert _pool_of(x, w3) == pw
    assert _uses(x, pw) == 1 and _uses(x, pg) == 1
    assert tms.enabled is True


def test_tms_pause_resume_keeps_backup_discards_the_rest(env):
    """simple.py and cpu_backup.py: pause gives the memory back, resume maps it at the same
    address; backup bytes come back, the others do not (zeros under xseg)."""
    x, tms, _, ptrs = env
    normal = x.malloc(MiB)
    with tms.region(enable_cpu_backup=True):
        kept = x.malloc(20 * MiB)
    with tms.region(enable_cpu_backup=False):
        dropped = x.malloc(20 * MiB)
    ptrs += [normal, kept, dropped]
    _write(normal, b"\x64" * MiB)
    _write(kept, b"\x0a" * MiB)
    _write(dropped, b"\x14" * MiB)
    before = _free(x)
    tms.pause()
    after_pause = _free(x)
    assert after_pause - before >= 40 * MiB
    assert x.sleep_stats(_pool_of(x, normal))["asleep"] == 0
    assert _read(normal, MiB) == b"\x64" * MiB  # outside every region: untouched
    unrelated = x.malloc(20 * MiB)  # "occupy some space" while paused
    ptrs.append(unrelated)
    tms.resume()
    assert before - _free(x) >= 40 * MiB - 20 * MiB  # mapped again (beside `unrelated`)
    assert _read(kept, MiB) == b"\x0a" * MiB
    assert _read(dropped, MiB) == bytes(MiB)  # torch_memory_saver: garbage; xseg: zeros
    # pause and resume again: still the same addresses and bytes
    tms.pause()
    tms.resume()
    assert _read(kept, MiB) == b"\x0a" * MiB


def test_tms_tags_are_independent(env):
    """cuda_graph.py and cpu_backup.py: pause("kv_cache") frees only its memory; the other tag's
    tensors stay usable; resume("kv_cache") brings it back."""
    x, tms, _, ptrs = env
    with tms.region(tag="kv_cache"):
        kv = x.malloc(40 * MiB)
    with tms.region(tag="model", enable_cpu_backup=True):
        m = x.malloc(2 * MiB)
    ptrs += [kv, m]
    _write(kv, b"\x01" * MiB)
    _write(m, b"\x02" * MiB)
    before = _free(x)
    tms.pause("kv_cache")
    assert _free(x) - before >= 40 * MiB
    assert x.sleep_stats(_pool_of(x, m))["asleep"] == 0
    assert _read(m, MiB) == b"\x02" * MiB
    _write(m, b"\x03" * MiB)  # the other tag stays writable
    tms.resume("kv_cache")
    assert _read(kv, MiB) == bytes(MiB)
    _write(kv, b"\x02" * MiB)  # cuda_graph.py writes the buffer again after resume
    assert _read(kv, MiB) == b"\x02" * MiB
    tms.pause(tag="model")
    tms.resume(tag="model")
    assert _read(m, MiB) == b"\x03" * MiB
    tms.pause("no_such_tag")  # no region of that tag: nothing to do, as there
    tms.resume("no_such_tag")


def test_tms_double_pause_and_resume_without_pause_raise(env):
    """torch_memory_saver exits the process on both; here RuntimeError, nothing changed."""
    x, tms, _, ptrs = env
    with tms.region(tag="a", enable_cpu_backup=True):
        a = x.malloc(MiB)
    with tms.region(tag="b"):
        b = x.malloc(MiB)
    ptrs += [a, b]
    _write(a, b"\x05" * MiB)
    _pool_of(x, a)
    with pytest.raises(RuntimeError, match=r"resume\(tag='a'\): 'a' not paused"):
        tms.resume("a")
    tms.pause("a")
    with pytest.raises(RuntimeError, match="'a' already paused"):
        tms.pause("a")
    with pytest.raises(RuntimeError, match="'a' already paused"):
        tms.pause()  # "b" is awake, "a" is not: nothing may sleep
    assert x.sleep_stats(_pool_of(x, b))["asleep"] == 0
    with pytest.raises(RuntimeError, match="'b' not paused"):
        tms.resume()
    assert x.sleep_stats(_pool_of(x, a))["asleep"] == 1
    with pytest.raises(RuntimeError, match="'a' .*is paused"):
        with tms.region(tag="a", enable_cpu_backup=True):
            pass
    tms.resume("a")
    assert _read(a, MiB) == b"\x05" * MiB


def test_tms_disable_is_never_paused(env):
    x, tms, _, ptrs = env
    with tms.region(tag="w"):
        w = x.malloc(MiB)
        with tms.disable():
            d = x.malloc(MiB)
    ptrs += [w, d]
    assert _pool_of(x, d) not in ((0, 0), _pool_of(x, w)) and x.pool_tag(_pool_of(x, d)) is None
    assert _uses(x, _pool_of(x, d)) == 0  # dropped at the block's end; `d` stays valid
    _write(d, b"\x07" * MiB)
    tms.pause()
    assert x.sleep_stats(_pool_of(x, d))["asleep"] == 0
    assert _read(d, MiB) == b"\x07" * MiB
    tms.resume()


def test_tms_memory_margin(env):
    x, tms, _, ptrs = env
    with tms.region(tag="m", enable_cpu_backup=True):
        m = x.malloc(4 * MiB)
    ptrs.append(m)
    _write(m, b"\x09" * MiB)
    _pool_of(x, m)
    tms.pause()
    tms.memory_margin_bytes = x.mem_get_info(0)[1]  # the whole device: resume must refuse
    from xseg.compat.torch_memory_saver import MemoryMarginError
    with pytest.raises(MemoryMarginError, match="memory_margin_bytes"):
        tms.resume()
    assert x.sleep_stats(_pool_of(x, m))["asleep"] == 1  # still paused, resumable
    tms.memory_margin_bytes = 0
    tms.resume()
    assert _read(m, MiB) == b"\x09" * MiB


def test_tms_arguments(env):
    x, tms, _, _ = env
    with pytest.raises(TypeError, match="tag must be a str"):
        with tms.region(tag=5):
            pass
    with pytest.raises(ValueError, match="must not be empty"):
        with tms.region(tag=""):
            pass
    with pytest.raises(TypeError, match="enable_cpu_backup must be a bool"):
        with tms.region(enable_cpu_backup="yes"):
            pass
    with pytest.raises(ValueError, match="requires enable_cpu_backup=True"):
        with tms.region(cpu_backup_backend="pinned"):
            pass
    with pytest.raises(ValueError, match="cpu_backup_backend must be one of"):
        with tms.region(enable_cpu_backup=True, cpu_backup_backend="disk"):
            pass
    with pytest.raises(ValueError, match="mutually exclusive"):
        with tms.region(enable_cpu_backup=True, enable_disk_backup=True):
            pass
    with pytest.raises(NotImplementedError, match="enable_disk_backup"):
        with tms.region(enable_disk_backup=True):
            pass
    with pytest.raises(TypeError, match="tag must be a str or None"):
        tms.pause(3)
    with pytest.raises(TypeError, match="memory_margin_bytes must be an int"):
        tms.memory_margin_bytes = 1.5
    with pytest.raises(ValueError, match=">= 0"):
        tms.memory_margin_bytes = -1
    with pytest.raises(NotImplementedError, match="get_cpu_backup"):
        tms.get_cpu_backup(object())
    assert tms.retain_cpu_backup is False
    with pytest.raises(NotImplementedError, match="retain_cpu_backup"):
        tms.retain_cpu_backup = True
    with pytest.raises(NotImplementedError, match="set_disk_backup_dir"):
        tms.set_disk_backup_dir("/tmp")
    with pytest.raises(NotImplementedError, match="needs torch"):
        with tms.cuda_graph(object()):
            pass
    with pytest.raises(RuntimeError, match="after initialization"):
        tms.hook_mode = "torch"  # initialized by the calls above
    from xseg.compat._backend import XsegBackend
    from xseg.compat.torch_memory_saver import TorchMemorySaver, configure_subprocess
    fresh = TorchMemorySaver(backend=XsegBackend())
    with pytest.raises(ValueError, match="hook_mode must be one of"):
        fresh.hook_mode = "ld_preload"
    fresh.hook_mode = "torch"
    assert fresh.hook_mode == "torch"
    env_before = dict(os.environ)
    with configure_subprocess():
        assert dict(os.environ) == env_before  # xseg needs no LD_PRELOAD


def test_tms_long_tags_map_to_xseg_tags(env):
    """Any str is a tag (torch_memory_saver's are free text); xseg's are 1-31 of [A-Za-z0-9_.-]."""
    x, tms, _, ptrs = env
    long_tag = "a tag with spaces and more than thirty-one characters"
    with tms.region(tag=long_tag, enable_cpu_backup=True):
        p = x.malloc(MiB)
    with tms.region(tag="other one"):
        q = x.malloc(MiB)
    ptrs += [p, q]
    tp, tq = x.pool_tag(_pool_of(x, p)), x.pool_tag(_pool_of(x, q))
    assert (tp, tq) == ("tms-0.cpu", "tms-1")
    # one to one: tag "x.cpu" without backup is not tag "x" with it; "0" is not the first long one
    with tms.region(tag="x", enable_cpu_backup=True):
        r = x.malloc(MiB)
    with tms.region(tag="x.cpu"):
        s = x.malloc(MiB)
    with tms.region(tag="0"):
        t = x.malloc(MiB)
    ptrs += [r, s, t]
    names = [x.pool_tag(_pool_of(x, v)) for v in (p, q, r, s, t)]
    assert names == ["tms-0.cpu", "tms-1", "tms.x.cpu", "tms-2", "tms.0"]
    _write(p, b"\x0b" * MiB)
    tms.pause(long_tag)
    assert x.sleep_stats(_pool_of(x, q))["asleep"] == 0
    tms.resume(long_tag)
    assert _read(p, MiB) == b"\x0b" * MiB


def test_tms_singleton_module():
    import xseg.compat.torch_memory_saver as m
    assert isinstance(m.torch_memory_saver, m.TorchMemorySaver)
    assert m.torch_memory_saver.enabled


# --- vLLM's CuMemAllocator -----------------------------------------------------------------------

def test_cumem_basic(env):
    """test_basic_cumem: default-pool memory and the allocator's pool used together; sleep gives
    device memory back; after wake_up the default tag's bytes are there again."""
    x, _, a, ptrs = env
    plain = x.malloc(4 * MiB)
    _write(plain, b"\x00" * MiB)
    with a.use_memory_pool():
        y = x.malloc(4 * MiB)
        z = x.malloc(4 * MiB)
    ptrs += [plain, y, z]
    assert _pool_of(x, y) == _pool_of(x, z) != (0, 0)
    assert x.pool_tag(_pool_of(x, y)) == "vllm.default"
    _write(y, b"\x01" * MiB)
    _write(z, b"\x02" * MiB)
    assert a.current_tag == "default"
    free = _free(x)
    a.sleep()
    assert _free(x) > free
    a.wake_up()
    assert _read(y, MiB) == b"\x01" * MiB and _read(z, MiB) == b"\x02" * MiB
    assert _read(plain, MiB) == bytes(MiB)


def test_cumem_discard_tag(env):
    """test_cumem_with_cudagraph's memory part: the default tag (the weight) is restored, the
    "discard" tag (the cache) is not (zeros under xseg)."""
    x, _, a, ptrs = env
    with a.use_memory_pool():
        weight = x.malloc(4 * MiB)
    with a.use_memory_pool(tag="discard"):
        assert a.current_tag == "discard"
        cache = x.malloc(4 * MiB)
    assert a.current_tag == "default"
    ptrs += [weight, cache]
    _write(weight, b"\x31" * MiB)
    _write(cache, b"\x32" * MiB)
    free = _free(x)
    a.sleep()
    assert _free(x) > free
    a.wake_up()
    assert _read(weight, MiB) == b"\x31" * MiB
    assert _read(cache, MiB) == bytes(MiB)


def test_cumem_offload_tags_and_wake_by_tags(env):
    """sleep(offload_tags) keeps only those tags' bytes; wake_up(tags) wakes a subset first (RL:
    weights, then the KV cache)."""
    x, _, a, ptrs = env
    with a.use_memory_pool(tag="weights"):
        w = x.malloc(2 * MiB)
    with a.use_memory_pool(tag="kv_cache"):
        kv = x.malloc(30 * MiB)
    with a.use_memory_pool():
        d = x.malloc(2 * MiB)
    ptrs += [w, kv, d]
    for p, b in ((w, b"\x41"), (kv, b"\x42"), (d, b"\x43")):
        _write(p, b * MiB)
        _pool_of(x, p)
    a.sleep(offload_tags="weights")  # a str is one tag
    assert x.sleep_stats(_pool_of(x, w))["offload"] and not x.sleep_stats(_pool_of(x, d))["offload"]
    free = _free(x)
    a.wake_up(tags=["weights"])
    assert free - _free(x) >= 2 * MiB
    assert _read(w, MiB) == b"\x41" * MiB
    assert x.sleep_stats(_pool_of(x, kv))["asleep"] == 1
    # A second sleep (offload_tags None: only "default" offloaded) sleeps only what is awake,
    # the weights, discarded; what sleeps stays as it is: "default" was discarded, this sleep
    # would offload it, and a warning says it stays discarded.
    with pytest.warns(UserWarning, match="'default' asleep already"):
        a.sleep()
    assert x.sleep_stats(_pool_of(x, w))["asleep"] == 1 and not x.sleep_stats(_pool_of(x, w))["offload"]
    a.wake_up(tags=["weights"])
    assert _read(w, MiB) == bytes(MiB)
    _write(w, b"\x41" * MiB)
    a.wake_up(tags=["weights"])  # awake: left alone
    assert _read(w, MiB) == b"\x41" * MiB
    a.wake_up(tags=["kv_cache"])
    assert _read(kv, MiB) == bytes(MiB)
    a.wake_up()  # the rest: default, discarded (not in offload_tags)
    assert _read(d, MiB) == bytes(MiB)
    # level 2: nothing offloaded
    _write(w, b"\x44" * MiB)
    a.sleep(offload_tags=())
    a.wake_up()
    assert _read(w, MiB) == bytes(MiB)
    # several tags offloaded
    _write(w, b"\x45" * MiB)
    _write(d, b"\x46" * MiB)
    a.sleep(offload_tags=("weights", "default"))
    a.wake_up(tags=("default", "weights", "no_such_tag"))  # a tag without a pool is ignored
    assert _read(w, MiB) == b"\x45" * MiB and _read(d, MiB) == b"\x46" * MiB
    assert x.sleep_stats(_pool_of(x, kv))["asleep"] == 1
    a.wake_up()


def test_cumem_discard(env):
    """discard(tags) (vLLM's newer allocators): the awake pools of those tags give their memory
    back without a backup; the others stay awake; wake_up maps them again, zeros."""
    x, _, a, ptrs = env
    with a.use_memory_pool(tag="weights"):
        w = x.malloc(2 * MiB)
    with a.use_memory_pool(tag="kv_cache"):
        kv = x.malloc(30 * MiB)
    ptrs += [w, kv]
    _write(w, b"\x71" * MiB)
    _write(kv, b"\x72" * MiB)
    _pool_of(x, w), _pool_of(x, kv)
    free = _free(x)
    a.discard("kv_cache")
    assert _free(x) - free >= 30 * MiB
    assert x.sleep_stats(_pool_of(x, kv))["asleep"] == 1 and x.sleep_stats(_pool_of(x, w))["asleep"] == 0
    assert _read(w, MiB) == b"\x71" * MiB
    a.discard(("kv_cache", "no_such_tag"))  # asleep already, and no pool: nothing to do
    a.sleep(offload_tags=("weights",))       # the rest; kv_cache stays discarded (no warning)
    a.wake_up()
    assert _read(w, MiB) == b"\x71" * MiB and _read(kv, MiB) == bytes(MiB)
    a.sleep(offload_tags=("weights",))
    with pytest.warns(UserWarning, match="'weights' asleep already, offloaded"):
        a.discard("weights")
    a.wake_up()
    assert _read(w, MiB) == b"\x71" * MiB


def test_cumem_current_usage(env):
    x, _, a, ptrs = env
    assert a.get_current_usage() == 0
    with a.use_memory_pool(tag="weights"):
        w = x.malloc(3 * MiB)
    ptrs.append(w)
    used = a.get_current_usage()
    assert used >= 3 * MiB
    outside = x.malloc(8 * MiB)  # not the allocator's
    ptrs.append(outside)
    assert a.get_current_usage() == used
    with a.use_memory_pool(tag="kv_cache"):
        kv = x.malloc(50 * MiB)
    ptrs.append(kv)
    both = a.get_current_usage()
    assert both >= used + 50 * MiB
    a.sleep()
    assert a.get_current_usage() == both  # what the pools hold again at wake_up
    a.wake_up()
    assert a.get_current_usage() == both


def test_cumem_wake_up_without_memory_raises(env):
    """test_python_error: a wake_up the device cannot hold raises RuntimeError; the pool stays
    asleep and wakes once the memory is there."""
    x, _, a, ptrs = env
    with a.use_memory_pool():
        big = x.malloc(64 * MiB)
    ptrs.append(big)
    _write(big, b"\x51" * MiB)
    _pool_of(x, big)
    a.sleep()
    x.set_per_process_memory_fraction(16 * MiB / x.mem_get_info(0)[1], 0)
    with pytest.raises(RuntimeError):
        a.wake_up()
    assert x.sleep_stats(_pool_of(x, big))["asleep"] == 1
    x.set_per_process_memory_fraction(1.0, 0)
    a.wake_up()
    assert _read(big, MiB) == b"\x51" * MiB


def test_cumem_errors(env):
    x, _, a, ptrs = env
    a.wake_up()  # nothing sleeps (nothing even allocated): nothing to do, as in vLLM
    with pytest.raises(TypeError, match="tag must be a str or None"):
        with a.use_memory_pool(tag=7):
            pass
    with pytest.raises(ValueError, match="must not be empty"):
        with a.use_memory_pool(tag=""):
            pass
    with a.use_memory_pool(tag="weights"):
        w = x.malloc(MiB)
    ptrs.append(w)
    with pytest.raises(TypeError, match="tags must hold only str"):
        a.discard(["weights", None])
    with pytest.raises(TypeError, match="offload_tags must be"):
        a.sleep(offload_tags=5)
    with pytest.raises(TypeError, match="only str"):
        a.sleep(offload_tags=("weights", 5))
    assert x.sleep_stats(_pool_of(x, w))["asleep"] == 0  # the refused calls slept nothing
    a.sleep()
    with pytest.raises(RuntimeError, match="'weights' sleeps"):
        with a.use_memory_pool(tag="weights"):
            pass
    with pytest.raises(TypeError, match="tags must be"):
        a.wake_up(tags=3)
    a.wake_up(tags="weights")


def test_cumem_singleton():
    from xseg.compat.vllm import CuMemAllocator, cumem_available
    assert cumem_available and CuMemAllocator.default_tag == "default"
    assert CuMemAllocator.get_instance() is CuMemAllocator.get_instance()


# --- switching by import --------------------------------------------------------------------------

def test_aliases_through_sitecustomize(tmp_path):
    """A sitecustomize.py on PYTHONPATH (xseg.compat.sitecustomize_example()) makes an engine's
    imports xseg's: vllm (a stand-in package with a cumem module of its own) still imports, its
    cumem names are xseg's, and `import torch_memory_saver` (a stand-in installed too) is xseg's."""
    import xseg.compat
    site = tmp_path / "site"
    (site / "vllm" / "device_allocator").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("REAL_VLLM = True\n")
    (site / "vllm" / "device_allocator" / "__init__.py").write_text("HandleType = tuple\n")
    (site / "vllm" / "device_allocator" / "cumem.py").write_text("raise ImportError('the real cumem')\n")
    (site / "torch_memory_saver.py").write_text("raise ImportError('the real torch_memory_saver')\n")
    (site / "sitecustomize.py").write_text(xseg.compat.sitecustomize_example())
    code = textwrap.dedent("""
        import vllm, vllm.device_allocator
        assert vllm.REAL_VLLM and vllm.device_allocator.HandleType is tuple
        from vllm.device_allocator.cumem import CuMemAllocator
        import xseg.compat.vllm
        assert CuMemAllocator is xseg.compat.vllm.CuMemAllocator
        import vllm.device_allocator.cumem as cumem
        assert vllm.device_allocator.cumem is cumem and cumem.cumem_available
        from torch_memory_saver import torch_memory_saver
        import torch_memory_saver as tms_mod
        import xseg.compat.torch_memory_saver as ours
        assert torch_memory_saver is ours.torch_memory_saver
        assert tms_mod.TorchMemorySaver is ours.TorchMemorySaver
        print("aliased")
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), os.path.join(ROOT, "python")])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "aliased" in r.stdout, r.stdout + r.stderr
    # Without the sitecustomize the stand-ins answer: the test sees the difference.
    os.remove(site / "sitecustomize.py")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "the real cumem" in r.stderr


def test_install_and_uninstall_aliases_in_process():
    import importlib
    import xseg.compat
    sys.modules.pop("torch_memory_saver", None)
    xseg.compat.install_aliases()
    try:
        xseg.compat.install_aliases()  # idempotent: one finder
        assert sum(isinstance(f, xseg.compat._AliasFinder) for f in sys.meta_path) == 1
        m = importlib.import_module("torch_memory_saver")
        assert m.__xseg_compat__ == "xseg.compat.torch_memory_saver"
    finally:
        xseg.compat.uninstall_aliases()
    assert "torch_memory_saver" not in sys.modules
    assert not any(isinstance(f, xseg.compat._AliasFinder) for f in sys.meta_path)


def test_guide_shows_the_sitecustomize_that_is_tested():
    """docs/guide.md's sitecustomize.py is sitecustomize_example()'s text, the one
    test_aliases_through_sitecustomize runs (test_doc_examples.py runs the block too)."""
    import xseg.compat
    with open(os.path.join(ROOT, "docs", "guide.md"), encoding="utf-8") as f:
        guide = f.read()
    assert "```python\n" + xseg.compat.sitecustomize_example() + "```" in guide


# --- the torch backend's code path, over a stand-in torch ----------------------------------------

def _fake_torch(x):
    """A stand-in `torch` with what the torch backend calls, doing what xseg's adapter does for
    each: MemPool() retains an xseg pool (xseg_pool_retain), use_mem_pool and graph() route
    allocations to it (begin/end allocate-to-pool), graph_pool_handle() is a fresh id."""
    import contextlib
    import types
    lib = x._lib

    def new_id():
        pid = lib.PoolId()
        lib.check(lib.need("xseg_pool_create")(ctypes.byref(pid)))
        return (pid.first, pid.second)

    def route(pool, device):
        begin, end = lib.need("xseg_begin_allocate_to_pool"), lib.need("xseg_end_allocate_to_pool")
        begin.argtypes = [ctypes.c_int, lib.PoolId, ctypes.c_void_p, ctypes.c_void_p]
        end.argtypes = [ctypes.c_int, lib.PoolId]

        @contextlib.contextmanager
        def cm():
            lib.check(begin(device, lib.PoolId(*pool), None, None))
            try:
                yield
            finally:  # PyTorch's use_mem_pool ends and releases the begin's use
                lib.check(end(device, lib.PoolId(*pool)))
                release(pool)
        return cm()

    def release(pool):
        f = lib.need("xseg_release_pool")
        f.argtypes = [ctypes.c_int, lib.PoolId]
        lib.check(f(0, lib.PoolId(*pool)))

    class MemPool:
        def __init__(self):
            self.id = new_id()
            retain = lib.need("xseg_pool_retain")
            retain.argtypes = [ctypes.c_int, lib.PoolId]
            lib.check(retain(0, lib.PoolId(*self.id)))

    calls = []

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, capture_error_mode="global"):
        calls.append(("graph", g, pool, stream, capture_error_mode))
        with route(pool, 0):
            yield

    cuda = types.SimpleNamespace(
        _release=release,
        MemPool=MemPool, current_device=lambda: 0, device=lambda d: contextlib.nullcontext(),
        use_mem_pool=lambda pool, device=None: route(pool.id, device), empty_cache=x.empty_cache,
        graph_pool_handle=new_id, graph=graph)
    return types.SimpleNamespace(cuda=cuda, calls=calls)


@pytest.fixture
def torch_env(env, monkeypatch):
    x = env[0]
    import xseg.torch
    fake = _fake_torch(x)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(xseg.torch, "_enabled", True)
    from xseg.compat.torch_memory_saver import TorchMemorySaver
    from xseg.compat.vllm import CuMemAllocator
    tms, cumem = TorchMemorySaver(), CuMemAllocator()
    yield x, tms, cumem, env[3], fake
    for (device, xtag) in list(tms._paused):
        x.wake(tags=[xtag], device=device)
    if cumem._asleep:
        cumem.wake_up()
    for p in env[3]:
        x.free(p)
    env[3].clear()
    for pool in list(tms._pools.values()) + [p for _x, p in cumem._pools.values()]:
        x.set_pool_tag(pool, None)
        fake.cuda._release(pool.id)  # the MemPool's own use (its destructor's release)
    for c in fake.calls:
        x.set_pool_tag(c[2], None)  # a graph pool: its use went with the capture's end


def test_torch_backend_regions_graphs_and_cumem(torch_env):
    x, tms, cumem, ptrs, fake = torch_env
    with tms.region(tag="weights", enable_cpu_backup=True):
        w = x.malloc(2 * MiB)
    g = object()
    with tms.cuda_graph(g, tag="graph", capture_error_mode="thread_local"):
        inter = x.malloc(4 * MiB)  # what the capture allocates
    with cumem.use_memory_pool(tag="kv_cache"):
        kv = x.malloc(2 * MiB)
    ptrs += [w, inter, kv]
    assert tms._backend.name == "torch" and cumem._backend.name == "torch"
    pool = fake.calls[0][2]
    assert fake.calls[0][1] is g and fake.calls[0][4] == "thread_local"
    assert _pool_of(x, inter) == tuple(pool) and x.pool_tag(pool) == "tms.graph"
    assert x.pool_tag(_pool_of(x, w)) == "tms.weights.cpu"
    assert x.pool_tag(_pool_of(x, kv)) == "vllm.kv_cache"
    _write(w, b"\x61" * MiB)
    _write(inter, b"\x62" * MiB)
    tms.pause("graph")
    assert x.sleep_stats(pool)["asleep"] == 1 and x.sleep_stats(_pool_of(x, w))["asleep"] == 0
    tms.pause("weights")
    cumem.sleep()
    assert cumem.get_current_usage() >= 2 * MiB
    cumem.wake_up()
    tms.resume()
    assert _read(w, MiB) == b"\x61" * MiB and _read(inter, MiB) == bytes(MiB)


def test_torch_backend_needs_xseg_as_the_allocator(torch_env, monkeypatch):
    import xseg.torch
    x, tms, _, _, _ = torch_env
    monkeypatch.setattr(xseg.torch, "_enabled", False)
    with pytest.raises(RuntimeError, match=r"xseg.torch.enable\(\)"):
        with tms.region(tag="late"):
            pass
