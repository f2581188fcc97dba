"""Every argument the package hands to libxseg is checked first: ctypes converts an int modulo
2**64 (malloc(2**64 + 4096) was a 4 KiB block, trim(2**64) trimmed to 0) and a str up to its
first NUL (set_config applied the prefix, dump_snapshot wrote to the shortened path). Each
refusal is TypeError, ValueError or OverflowError naming the function and the argument, and the
library works afterwards."""
import os
import pathlib

import pytest

MiB = 1 << 20


class Index:
    """An integer that is not an int (numpy and torch integers): accepted through __index__."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


class Stream:
    def __init__(self, handle):
        self.cuda_stream = handle


def still_works(xseg):
    p = xseg.malloc(MiB, 0)
    assert p and xseg.memory_allocated(0) >= MiB
    xseg.free(p)


def test_malloc_size_is_not_wrapped(xseg):
    before = xseg.memory_allocated(0)
    with pytest.raises(OverflowError, match=r"^xseg\.malloc: size must be 0 <= size < 2\*\*64, got %d$"
                       % (2**64 + 4096)):
        xseg.malloc(2**64 + 4096, 0)
    with pytest.raises(ValueError, match=r"^xseg\.malloc: size must be 0 <= size < 2\*\*64, got -1$"):
        xseg.malloc(-1, 0)
    with pytest.raises(TypeError, match=r"^xseg\.malloc: size must be an integer .*not bool"):
        xseg.malloc(True, 0)
    with pytest.raises(TypeError, match=r"^xseg\.malloc: size must be an integer .*not float"):
        xseg.malloc(4096.0, 0)
    assert xseg.memory_allocated(0) == before
    p = xseg.malloc(Index(4096), Index(0))
    assert p
    xseg.free(Index(p))
    still_works(xseg)


def test_trim_is_not_wrapped(xseg):
    xseg.empty_cache()
    p = xseg.malloc(64 * MiB, 0)
    xseg.free(p)
    cached = xseg.memory_reserved(0) - xseg.memory_allocated(0)
    assert cached >= 64 * MiB
    with pytest.raises(OverflowError, match=r"^xseg\.trim: keep_bytes must be 0 <= keep_bytes < 2\*\*64"):
        xseg.trim(2**64)
    assert xseg.memory_reserved(0) - xseg.memory_allocated(0) == cached  # nothing was trimmed
    xseg.trim(0)
    assert xseg.memory_reserved(0) - xseg.memory_allocated(0) < cached


def refusals(xseg, tmp):
    """(call, exception, the message's start) for every public entry point's integer arguments."""
    f = "xseg.%s: %s must be "
    big = 2**64
    out = []

    def dev(name, fn, all_devices=False):
        out.append((lambda: fn(2**31), OverflowError, f % (name, "device")))
        out.append((lambda: fn(-2), ValueError, f % (name, "device")))
        if not all_devices:
            out.append((lambda: fn(-1), ValueError, f % (name, "device")))
        out.append((lambda: fn(1.0), TypeError, f % (name, "device")))
        out.append((lambda: fn(True), TypeError, f % (name, "device")))
        out.append((lambda: fn("cuda:%d" % 2**32), OverflowError, f % (name, "device")))

    dev("malloc", lambda d: xseg.malloc(1, d))
    out += [
        (lambda: xseg.malloc(1, 0, big), OverflowError, f % ("malloc", "stream")),
        (lambda: xseg.malloc(1, 0, -1), ValueError, f % ("malloc", "stream")),
        (lambda: xseg.malloc(1, 0, 1.5), TypeError, f % ("malloc", "stream")),
        (lambda: xseg.malloc(1, 0, Stream(big + 7)), OverflowError, f % ("malloc", "stream")),
        (lambda: xseg.free(-1), ValueError, f % ("free", "ptr")),
        (lambda: xseg.free(big), OverflowError, f % ("free", "ptr")),
        (lambda: xseg.free("0"), TypeError, f % ("free", "ptr")),
        (lambda: xseg.record_stream(big, None), OverflowError, f % ("record_stream", "ptr")),
        (lambda: xseg.record_stream(4096, -5), ValueError, f % ("record_stream", "stream")),
    ]
    for name in ("memory_stats", "memory_stats_as_nested_dict", "memory_allocated", "max_memory_allocated",
                 "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
                 "reset_accumulated_memory_stats", "memory_summary"):
        dev(name, getattr(xseg, name))
    dev("empty_cache", xseg.empty_cache, all_devices=True)
    dev("memory_snapshot", xseg.memory_snapshot, all_devices=True)
    dev("trim", lambda d: xseg.trim(0, d), all_devices=True)
    out += [
        (lambda: xseg.trim(-1), ValueError, f % ("trim", "keep_bytes")),
        (lambda: xseg.trim(Index(big)), OverflowError, f % ("trim", "keep_bytes")),
    ]
    for name in ("sleep", "wake", "sleep_stats"):
        fn = getattr(xseg, name)
        dev(name, lambda d, fn=fn: fn(xseg.DEFAULT_POOL, d))
        out += [
            (lambda fn=fn: fn((big, 0)), OverflowError, f % (name, r"pool\[0\]")),
            (lambda fn=fn: fn((0, -1)), ValueError, f % (name, r"pool\[1\]")),
            (lambda fn=fn: fn((0, 1.0)), TypeError, f % (name, r"pool\[1\]")),
        ]
    name = "set_per_process_memory_fraction"
    dev(name, lambda d: xseg.set_per_process_memory_fraction(0.5, d))
    out += [
        (lambda: xseg.set_per_process_memory_fraction(float("nan"), 0), ValueError, f % (name, "fraction")),
        (lambda: xseg.set_per_process_memory_fraction(10**400, 0), ValueError, f % (name, "fraction")),
        (lambda: xseg.set_per_process_memory_fraction(-0.5, 0), ValueError, f % (name, "fraction")),
        (lambda: xseg.set_per_process_memory_fraction(True, 0), TypeError, f % (name, "fraction")),
    ]
    path = os.path.join(tmp, "never.pickle")
    for name in ("dump_snapshot", "dump_snapshot_json", "dump_trace"):
        dev(name, lambda d, fn=getattr(xseg, name): fn(path, d), all_devices=True)
    name = "record_memory_history"
    dev(name, lambda d: xseg.record_memory_history(device=d))
    out += [
        (lambda: xseg.record_memory_history(max_entries=-1), ValueError, f % (name, "max_entries")),
        (lambda: xseg.record_memory_history(max_entries=1.5), TypeError, f % (name, "max_entries")),
        (lambda: xseg.record_memory_history(max_frames=2**31), OverflowError, f % (name, "max_frames")),
        (lambda: xseg.record_memory_history(max_frames=-1), ValueError, f % (name, "max_frames")),
        (lambda: xseg.ipc_export(-1), ValueError, f % ("ipc_export", "ptr")),
        (lambda: xseg.ipc_export(big), OverflowError, f % ("ipc_export", "ptr")),
        (lambda: xseg.ipc_close(big), OverflowError, f % ("ipc_close", "ptr")),
        (lambda: xseg.block_handles(-1), ValueError, f % ("block_handles", "ptr")),
        (lambda: xseg.block_handles_release(big), OverflowError, f % ("block_handles_release", "ptr")),
        (lambda: xseg.ipc_import(None, 2**31), OverflowError, f % ("ipc_import", "device")),
        (lambda: xseg.ipc_import(None, -1), ValueError, f % ("ipc_import", "device")),
        (lambda: xseg.IpcHandle(None).send(-1), ValueError, f % ("IpcHandle.send", "sock")),
        (lambda: xseg.IpcHandle.recv(2**31), OverflowError, f % ("IpcHandle.recv", "sock")),
        (lambda: xseg.IpcHandle.recv(1.0), TypeError, f % ("IpcHandle.recv", "sock")),
    ]
    return out


def test_every_integer_argument(xseg, tmp_path):
    import re
    for call, exc, start in refusals(xseg, str(tmp_path)):
        with pytest.raises(exc) as ei:
            call()
        assert type(ei.value) is exc, (start, ei.value)
        assert re.match(start, str(ei.value)), (start, str(ei.value))
    assert os.listdir(str(tmp_path)) == []
    with pytest.raises(TypeError, match="handle must be an xseg.IpcHandle"):
        xseg.ipc_import(1234, 0)
    with pytest.raises(TypeError, match="data must be bytes-like"):
        xseg.IpcHandle.deserialize(10**10)  # bytes(n) would have made 10 GB of zeros
    xseg.record_memory_history(enabled=None)
    still_works(xseg)


def test_strings_with_nul(xseg, tmp_path):
    cfg = xseg.get_config()
    for bad in ("garbage_collection_threshold:0.5\0nonsense", "\0"):
        with pytest.raises(ValueError, match=r"^xseg\.set_config: config contains a NUL character"):
            xseg.set_config(bad)
    assert xseg.get_config() == cfg  # the prefix was not applied
    with pytest.raises(ValueError, match=r"^xseg\.set_config: config cannot be encoded as UTF-8"):
        xseg.set_config("garbage_collection_threshold:0.5\udcff")
    with pytest.raises(TypeError, match=r"^xseg\.set_config: config must be a str, not bytes"):
        xseg.set_config(b"garbage_collection_threshold:0.5")
    with pytest.raises(ValueError, match=r"^xseg\.init: config contains a NUL character"):
        xseg.init("garbage_collection_threshold:0.5\0x")
    with pytest.raises(TypeError, match=r"^xseg\.init: config must be a str"):
        xseg.init(5)
    assert xseg.get_config() == cfg
    short = tmp_path / "snap.pickle"
    for name in ("dump_snapshot", "dump_snapshot_json", "dump_trace", "set_oom_snapshot"):
        fn = getattr(xseg, name)
        for bad in (str(short) + "\0.evil", os.fsencode(str(short)) + b"\0x", pathlib.Path(str(short) + "\0")):
            with pytest.raises(ValueError, match=r"^xseg\.%s: path contains a NUL character" % name):
                fn(bad)
        with pytest.raises(TypeError, match=r"^xseg\.%s: path must be a path" % name):
            fn(5)
        assert not short.exists(), name  # nothing was written to the shortened path
    xseg.set_oom_snapshot(None)
    # A good path of each kind still works.
    xseg.dump_snapshot(short)
    xseg.dump_snapshot_json(os.fsencode(str(tmp_path / "snap.json")))
    assert short.exists() and (tmp_path / "snap.json").exists()
    still_works(xseg)
