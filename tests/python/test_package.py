"""The xseg package through a real libxseg on cudaemu: every function and its errors."""
import ctypes
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

MiB = 1 << 20
PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


def run_py(code, **env):
    """Run code in a fresh interpreter; env values of None remove the variable."""
    e = dict(os.environ)
    e.update(env)
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
    e["PYTHONPATH"] = PKG
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                          capture_output=True, text=True, timeout=60)


def torch_stat_keys():
    """PyTorch's memory_stats() keys, built from its rules (c10 DeviceStats)."""
    keys = []
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                 "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "small_pool", "large_pool"):
            for f in ("current", "peak", "allocated", "freed"):
                keys.append("%s.%s.%s" % (name, pool, f))
    for name in ("oversize_allocations", "oversize_segments"):
        for f in ("current", "peak", "allocated", "freed"):
            keys.append("%s.%s" % (name, f))
    keys += ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
             "num_device_free", "max_split_size"]
    # xseg's spill (spill_to_host)
    keys += ["spilled_bytes.all.current", "spilled_bytes.all.peak", "spilled_bytes.all.allocated",
             "spilled_bytes.all.freed", "num_spills", "num_promotions", "spill_copied_bytes",
             "spill_numa_node", "spill_numa_fallback"]
    return sorted(keys)


def test_import_needs_only_the_standard_library():
    r = run_py("""
        import sys, xseg
        bad = [m for m in ('torch', 'numpy', 'cupy') if m in sys.modules]
        assert not bad, bad
        print(xseg.version())
        """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().count(".") == 2


def test_version_matches_header(xseg):
    hdr = open(os.path.join(PKG, "..", "include", "xseg.h")).read()
    parts = []
    for p in ("MAJOR", "MINOR", "PATCH"):
        line = [l for l in hdr.splitlines() if l.startswith("#define XSEG_API_VERSION_" + p)][0]
        parts.append(line.split()[-1])
    assert xseg.version() == ".".join(parts) == xseg.__version__
    # meson's reading of the header (build-aux/version.sh), which pyproject.toml's dynamic version
    # and the installed xseg/_version.py take
    r = subprocess.run(["sh", os.path.join(PKG, "..", "build-aux", "version.sh")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == ".".join(parts), r.stdout + r.stderr
    with open(os.path.join(PKG, "..", "pyproject.toml")) as f:
        toml = f.read()
    assert 'dynamic = ["version"]' in toml and "\nversion =" not in toml


def test_library_not_found_names_what_was_tried():
    r = run_py("import xseg; xseg.device_count()", XSEG_LIBRARY="/nonexistent/libxseg.so")
    assert r.returncode != 0
    assert "/nonexistent/libxseg.so" in r.stderr and "XSEG_LIBRARY" in r.stderr


def test_malloc_free_and_counters(xseg):
    before = xseg.memory_allocated(0)
    p = xseg.malloc(3 * MiB, 0)
    assert p != 0
    assert xseg.memory_allocated(0) == before + 3 * MiB
    assert xseg.max_memory_allocated(0) >= before + 3 * MiB
    assert xseg.memory_reserved("cuda:0") >= 3 * MiB
    xseg.free(p)
    assert xseg.memory_allocated() == before
    assert xseg.malloc(0) == 0
    xseg.free(0)


def test_torch_spellings(xseg, tmp_path):
    """torch.cuda's names for what xseg does: caching_allocator_alloc/_delete allocate and free,
    mem_get_info is the driver's (free, total) and sees xseg's segments, and
    torch.cuda.memory's _record_memory_history / _dump_snapshot record and write a snapshot."""
    xseg.empty_cache()
    free0, total = xseg.mem_get_info(0)
    assert 0 < free0 <= total
    assert xseg.mem_get_info() == xseg.mem_get_info("cuda:0")
    reserved0 = xseg.memory_reserved(0)
    before = xseg.memory_allocated(0)
    xseg._record_memory_history(max_entries=1000)
    try:
        p = xseg.caching_allocator_alloc(64 * MiB)
        assert xseg.memory_allocated(0) == before + 64 * MiB
        grew = xseg.memory_reserved(0) - reserved0
        assert grew >= 64 * MiB
        assert xseg.mem_get_info(0) == (free0 - grew, total)  # the driver's view of xseg's growth
        path = str(tmp_path / "snap.pickle")
        xseg._dump_snapshot(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        allocs = [e for t in snap["device_traces"] for e in t if e["action"] == "alloc"]
        assert any(e["size"] == 64 * MiB for e in allocs), allocs
        xseg.caching_allocator_delete(p)
        assert xseg.memory_allocated(0) == before
    finally:
        xseg._record_memory_history(enabled=None)
    with pytest.raises(xseg.XsegError) as ei:
        xseg.mem_get_info(99)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_DEVICE"


def test_torch_named_getters_read_memory_stats(xseg):
    """memory_allocated, max_memory_allocated, memory_reserved and max_memory_reserved are
    memory_stats' keys, as torch.cuda's are; the peaks stay after a free and an empty_cache, and
    reset_peak_memory_stats brings them down to the current values."""
    xseg.empty_cache()
    xseg.reset_peak_memory_stats(0)
    getters = {"memory_allocated": "allocated_bytes.all.current",
               "max_memory_allocated": "allocated_bytes.all.peak",
               "memory_reserved": "reserved_bytes.all.current",
               "max_memory_reserved": "reserved_bytes.all.peak"}
    p = xseg.malloc(24 * MiB)
    q = xseg.malloc(MiB)
    try:
        s = xseg.memory_stats(0)
        for name, key in getters.items():
            for dev in (0, None, "cuda:0"):
                assert getattr(xseg, name)(dev) == s[key], (name, dev)
        assert xseg.memory_reserved(0) >= xseg.memory_allocated(0) >= 25 * MiB
    finally:
        xseg.free(p)
    xseg.empty_cache()
    peak_reserved = s["reserved_bytes.all.peak"]
    assert xseg.memory_reserved(0) < peak_reserved == xseg.max_memory_reserved(0)
    assert xseg.memory_allocated(0) < s["allocated_bytes.all.peak"] == xseg.max_memory_allocated(0)
    xseg.reset_peak_memory_stats(0)
    assert xseg.max_memory_reserved(0) == xseg.memory_reserved(0) < peak_reserved
    assert xseg.max_memory_allocated(0) == xseg.memory_allocated(0) >= MiB
    xseg.free(q)
    with pytest.raises(xseg.XsegError) as ei:
        xseg.max_memory_reserved(99)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_DEVICE"


def test_stats_keys_equal_pytorchs(xseg):
    stats = xseg.memory_stats(0)
    assert list(stats) == torch_stat_keys()
    assert len(stats) == 122 + 9  # PyTorch's, and spill's (spilled_bytes.all.*, 3 counts, where)
    # The manual counts them right.
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    for doc in ("README.md", os.path.join("docs", "python.md")):
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            text = f.read()
        assert "%d keys: torch.cuda.memory_stats()'s 122 and spill's 9" % len(stats) in text, doc
    nested = xseg.memory_stats_as_nested_dict(0)
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]
    assert nested["num_ooms"] == stats["num_ooms"]


def test_reset_peak(xseg):
    p = xseg.malloc(8 * MiB)
    xseg.free(p)
    assert xseg.memory_stats()["allocated_bytes.all.peak"] >= 8 * MiB
    xseg.reset_peak_memory_stats()
    s = xseg.memory_stats()
    assert s["allocated_bytes.all.peak"] == s["allocated_bytes.all.current"]


def test_reset_accumulated(xseg):
    p = xseg.malloc(8 * MiB)
    xseg.free(p)
    before = xseg.memory_stats()
    assert before["allocation.all.allocated"] >= 1
    xseg.reset_accumulated_memory_stats()
    s = xseg.memory_stats()
    for key, value in s.items():
        if key.endswith((".allocated", ".freed")) or key in (
                "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                "num_device_free"):
            assert value == 0, key
    assert s["allocated_bytes.all.peak"] == before["allocated_bytes.all.peak"]
    assert s["reserved_bytes.all.current"] == before["reserved_bytes.all.current"]
    q = xseg.malloc(MiB)
    xseg.free(q)
    assert xseg.memory_stats()["allocation.all.allocated"] == 1
    with pytest.raises(xseg.XsegError) as ei:
        xseg.reset_accumulated_memory_stats(99)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_DEVICE"


def test_spill_hint_location_promote(xseg):
    p = xseg.malloc(8 * MiB)
    xseg.spill_hint(p)
    assert xseg.block_location(p) == ("device", 0, -1)
    xseg.spill_hint(p, cold=False)
    stats = xseg.memory_stats()
    assert stats["spill_numa_node"] == -1 and stats["spill_numa_fallback"] == -1  # nothing spilled yet

    class Storage:
        def data_ptr(self):
            return p

    class Tensor:  # what xseg.torch.mark_cold reads of a tensor
        def untyped_storage(self):
            return Storage()

    import xseg.torch as xt
    xt.mark_cold(Tensor())
    xt.mark_cold(Tensor(), cold=False)
    xseg.promote()  # nothing spilled: nothing to do
    with pytest.raises(xseg.XsegError) as ei:
        xseg.block_location(p + 4096)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"
    xseg.free(p)
    with pytest.raises(xseg.XsegError):
        xseg.spill_hint(p)
    assert xseg.memory_stats()["spilled_bytes.all.current"] == 0


def test_summary(xseg):
    text = xseg.memory_summary(0)
    assert "memory summary" in text and "device ID 0" in text
    assert "Allocated memory" in text or "allocated" in text.lower()


def test_empty_cache_gives_memory_back(xseg):
    p = xseg.malloc(40 * MiB)
    xseg.free(p)
    assert xseg.memory_reserved() >= 40 * MiB
    xseg.empty_cache()
    assert xseg.memory_reserved() == 0
    assert xseg.memory_stats()["num_device_free"] > 0


def test_memory_fraction_and_oom(xseg):
    total = None
    seen = []
    xseg.attach_oom_observer(lambda dev, req, tot, free: seen.append((dev, req, tot, free)))
    xseg.set_per_process_memory_fraction(0.01, 0)
    with pytest.raises(xseg.XsegOutOfMemoryError) as ei:
        xseg.malloc(1 << 40)
    assert isinstance(ei.value, MemoryError)
    assert ei.value.status_name == "XSEG_ERROR_OUT_OF_MEMORY"
    assert seen and seen[-1][0] == 0 and seen[-1][1] >= 1 << 40
    assert xseg.memory_stats()["num_ooms"] >= 1
    with pytest.raises(ValueError) as ei:  # checked before C sees it (test_arguments.py)
        xseg.set_per_process_memory_fraction(1.5, 0)
    assert "fraction" in str(ei.value) and "1.5" in str(ei.value)
    with pytest.raises(TypeError):
        xseg.set_per_process_memory_fraction("half")


def test_snapshot_describes_live_blocks(xseg):
    p = xseg.malloc(5 * MiB)
    try:
        segs = xseg.memory_snapshot()
        blocks = [b for s in segs for b in s["blocks"] if b["address"] == p]
        assert len(blocks) == 1
        b = blocks[0]
        assert b["state"] == "active_allocated" and b["size"] >= 5 * MiB
        assert b["requested_size"] == 5 * MiB
        seg = [s for s in segs if any(x["address"] == p for x in s["blocks"])][0]
        assert seg["segment_type"] == "large" and seg["device"] == 0
        assert seg["address"] <= p < seg["address"] + seg["total_size"]
        for key in ("allocated_size", "active_size", "requested_size", "stream",
                    "segment_pool_id", "is_expandable", "frames"):
            assert key in seg
        # blocks tile their segment, as PyTorch's tools assume
        for s in segs:
            addr = s["address"]
            for x in s["blocks"]:
                assert x["address"] == addr
                addr += x["size"]
            assert addr == s["address"] + s["total_size"]
    finally:
        xseg.free(p)


def test_dump_snapshot_reads_back(xseg, tmp_path):
    p = xseg.malloc(2 * MiB)
    try:
        path = tmp_path / "snap.pickle"
        xseg.dump_snapshot(str(path))
        with open(path, "rb") as f:
            snap = pickle.load(f)
        assert "segments" in snap and "device_traces" in snap
        assert any(b["address"] == p and b["state"] == "active_allocated"
                   for s in snap["segments"] for b in s["blocks"])
    finally:
        xseg.free(p)


def test_config_roundtrip_and_errors(xseg):
    cfg = xseg.get_config()
    assert "expandable_segments:" in cfg
    xseg.set_config(cfg)
    assert xseg.get_config() == cfg
    with pytest.raises(xseg.XsegError) as ei:
        xseg.set_config("no_such_key:1")
    assert "no_such_key" in str(ei.value)
    assert xseg.get_config() == cfg
    with pytest.raises(TypeError):
        xseg.set_config(None)


def test_device_arguments(xseg):
    assert xseg.device_count() >= 1
    with pytest.raises(xseg.XsegError) as ei:
        xseg.memory_stats(99)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_DEVICE"
    with pytest.raises(ValueError):
        xseg.memory_stats("cpu")
    with pytest.raises(TypeError):
        xseg.memory_stats(True)

    class Dev:  # a torch.device look-alike
        type, index = "cuda", 0
    assert xseg.memory_stats(Dev())["num_ooms"] >= 0


def _cudaemu():
    """cudaemu, the driver xseg loaded, through ctypes; None on a real driver."""
    path = os.environ.get("XSEG_LIBCUDA")
    lib = ctypes.CDLL(path) if path else None
    if lib is None or not hasattr(lib, "cudaemu_stream_hold"):
        return None
    lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    for name in ("cuStreamDestroy_v2", "cudaemu_stream_hold", "cudaemu_stream_release"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    return lib


def block_state(x, ptr):
    return [b["state"] for s in x.memory_snapshot() for b in s["blocks"] if b["address"] == ptr]


@pytest.mark.parametrize("config", ["expandable_segments:True", "expandable_segments:False"])
@pytest.mark.parametrize("size", [512 << 10, 4 * MiB, 30 * MiB])
def test_record_stream_keeps_a_freed_block_until_the_side_stream_is_done(xseg, config, size):
    """A block used on a side stream (record_stream) and freed while that stream still works on
    it is not handed out again until the stream's work completes; then it is. cudaemu holds the
    side stream's work pending, as a long kernel would."""
    emu = _cudaemu()
    if emu is None:
        pytest.skip("needs cudaemu (it holds a stream's work pending)")
    saved = xseg.get_config()
    xseg.set_config(config)
    side = ctypes.c_void_p()
    try:
        p = xseg.malloc(size)
        assert emu.cuStreamCreate(ctypes.byref(side), 1) == 0  # CU_STREAM_NON_BLOCKING

        class TorchStream:  # record_stream takes torch/CuPy stream objects too
            cuda_stream = side.value
        xseg.record_stream(p, TorchStream())
        emu.cudaemu_stream_hold(side)
        xseg.free(p)
        assert block_state(xseg, p) == ["active_pending_free"]
        q = xseg.malloc(size)
        assert q != p
        assert block_state(xseg, p) == ["active_pending_free"]
        emu.cudaemu_stream_release(side)
        r = xseg.malloc(size)  # the side stream is done: the block is free again, and fits best
        assert r == p
        assert block_state(xseg, p) == ["active_allocated"]
        xseg.free(q)
        xseg.free(r)
        # Control: without record_stream, a freed block is reused at once.
        xseg.free(xseg.malloc(size))
        a = xseg.malloc(size)
        xseg.free(a)
        assert xseg.malloc(size) == a
        xseg.free(a)
    finally:
        if side.value:
            emu.cudaemu_stream_release(side)
            assert emu.cuStreamDestroy_v2(side) == 0
        xseg.set_config(saved)


def test_record_stream_on_bad_pointer(xseg):
    with pytest.raises(xseg.XsegError) as ei:
        xseg.record_stream(0x1234, None)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"


def test_init_applies_the_config_given():
    r = run_py("""
        import xseg
        xseg.init("expandable_segments:False,max_split_size_mb:64")
        cfg = xseg.get_config()
        assert "expandable_segments:False" in cfg and "max_split_size_mb:64" in cfg, cfg
        xseg.init("expandable_segments:True")  # again: re-applied
        assert "expandable_segments:True" in xseg.get_config()
        p = xseg.malloc(1 << 20)
        xseg.free(p)
        print("ok")
        """, XSEG_ALLOC_CONF=None)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_init_without_config_reads_the_environment():
    code = """
        import xseg
        xseg.init()
        print(xseg.get_config())
        """
    r = run_py(code, XSEG_ALLOC_CONF="expandable_segments:False,max_split_size_mb:64")
    assert r.returncode == 0, r.stderr
    assert "expandable_segments:False" in r.stdout and "max_split_size_mb:64" in r.stdout, r.stdout
    # PyTorch's variable, when xseg's is not set
    e = {"XSEG_ALLOC_CONF": None, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    r = run_py(code, **e)
    assert r.returncode == 0, r.stderr
    assert "expandable_segments:False" in r.stdout, r.stdout
    # a config given to init is used instead of the environment's
    r = run_py("""
        import xseg
        xseg.init("max_split_size_mb:64")
        print(xseg.get_config())
        """, XSEG_ALLOC_CONF="expandable_segments:False")
    assert r.returncode == 0, r.stderr
    assert "expandable_segments:True" in r.stdout and "max_split_size_mb:64" in r.stdout, r.stdout


def test_init_errors():
    r = run_py("""
        import xseg
        try:
            xseg.init("no_such_key:1")
        except xseg.XsegError as e:
            assert e.status_name == "XSEG_ERROR_INVALID_VALUE" and "no_such_key" in str(e), e
        else:
            raise AssertionError("no error")
        xseg.init("expandable_segments:False")  # usable after the error
        assert "expandable_segments:False" in xseg.get_config()
        print("ok")
        """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    r = run_py("""
        import xseg
        try:
            xseg.init()
        except xseg.XsegError as e:
            assert e.status_name == "XSEG_ERROR_DRIVER" and "/nonexistent/libcuda.so" in str(e), e
            print("ok")
        """, XSEG_LIBCUDA="/nonexistent/libcuda.so")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_config_overflow_is_refused_as_typed():
    """A numeric value past the integer parse, or whose MiB overflow bytes, is refused through the
    environment and set_config alike (one parser), quoting the value as typed with the key and
    its range: max_split_size_mb of one was once taken as unlimited, expandable_chunk_mb's
    message showed 18446744073709551615."""
    code = """
        import xseg
        try:
            xseg.init()
        except xseg.XsegError as e:
            assert e.status_name == "XSEG_ERROR_INVALID_VALUE", e
            print(e)
        else:
            print("accepted")
        """
    for var in ("XSEG_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env = {"XSEG_ALLOC_CONF": None, var: "expandable_segments:True,max_split_size_mb:99999999999999999999"}
        r = run_py(code, **env)
        assert r.returncode == 0, r.stderr
        for want in (var, "max_split_size_mb", "got '99999999999999999999' at index 43", "to 17592186044415"):
            assert want in r.stdout, (want, r.stdout)
    r = run_py("""
        import xseg
        xseg.init("")
        for conf in ("expandable_chunk_mb:99999999999999999999", "release_threshold_mb:17592186044416"):
            try:
                xseg.set_config(conf)
            except xseg.XsegError as e:
                print(e)
            else:
                print("accepted", conf)
        print(xseg.get_config())
        """, XSEG_ALLOC_CONF=None)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "expandable_chunk_mb" in lines[0] and "got '99999999999999999999'" in lines[0], lines
    assert "18446744073709551615" not in lines[0], lines
    assert "release_threshold_mb" in lines[1] and "got '17592186044416'" in lines[1], lines
    assert "up to 17592186044415" in lines[1], lines
    assert "expandable_chunk_mb:0" in lines[2] and "release_threshold_mb" not in lines[2], lines


BARE_TORCH_MALLOC = """
    import ctypes, xseg
    lib = xseg._lib.lib()
    lib.xseg_torch_malloc.restype = ctypes.c_void_p
    lib.xseg_torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    if %r:
        lib.xseg_torch_adapter_attached(1)
    for _ in range(3):
        assert lib.xseg_torch_malloc(4096, 0, None)
    """


def test_bare_pluggable_allocator_warns_once():
    r = run_py(BARE_TORCH_MALLOC % False)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("xseg: warning: xseg_torch_malloc") == 1
    assert "record_stream" in r.stderr and "xseg.torch.enable()" in r.stderr


def test_warning_silenced_by_env_or_adapter():
    r = run_py(BARE_TORCH_MALLOC % False, XSEG_NO_TORCH_WARNING="1")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr
    r = run_py(BARE_TORCH_MALLOC % True)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr


def test_memory_snapshot_of_one_pool(xseg):
    """MemPool.snapshot() asks torch.cuda.memory_snapshot(mempool_id=pool.id): only that pool's
    segments (issue 34; xseg.torch answers it with the same filter)."""
    import ctypes
    lib = xseg._lib.lib()
    pool = xseg._lib.PoolId()
    assert lib.xseg_pool_create(ctypes.byref(pool)) == 0
    begin = lib.xseg_begin_allocate_to_pool
    begin.argtypes = [ctypes.c_int, xseg._lib.PoolId, ctypes.c_void_p, ctypes.c_void_p]
    end = lib.xseg_end_allocate_to_pool
    end.argtypes = [ctypes.c_int, xseg._lib.PoolId]
    assert begin(0, pool, None, None) == 0
    inside = xseg.malloc(1 << 20)
    assert end(0, pool) == 0
    outside = xseg.malloc(1 << 20)
    try:
        pid = (pool.first, pool.second)
        mine = xseg.memory_snapshot(mempool_id=pid)
        assert mine and all(s["segment_pool_id"] == pid for s in mine)
        assert any(b["address"] == inside for s in mine for b in s["blocks"])
        assert not any(b["address"] == outside for s in mine for b in s["blocks"])
        assert len(xseg.memory_snapshot()) > len(mine)
        assert xseg.memory_snapshot(mempool_id=(123456789, 1)) == []
        with pytest.raises(TypeError, match="mempool_id"):
            xseg.memory_snapshot(mempool_id=5)
    finally:
        xseg.free(inside)
        xseg.free(outside)
        lib.xseg_release_pool(0, pool)
