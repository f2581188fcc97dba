"""xseg from Python: the allocator's statistics, summary, snapshots, cache control and
configuration, with torch.cuda's names and meanings, over libxseg through ctypes.

Importing needs only the standard library. `xseg.torch.enable()` installs xseg as PyTorch's CUDA
allocator with every hook wired; `xseg.cupy.enable()` does the same for CuPy.

Every function that takes `device` accepts an index, "cuda:N", an object with an `.index`
(torch.device), or None for the current device (torch's current device when torch has
initialized CUDA, else 0). Failures raise XsegError with xseg's message.

Arguments are checked before they reach C (ctypes would wrap integers modulo 2**64 and cut
strings at a NUL): an integer argument that is not an integer (or is a bool) raises TypeError, one
below its domain (a negative size) ValueError, one the C type cannot hold OverflowError; a string
or path with a NUL raises ValueError. The message names the function and the argument.
"""
import collections
import ctypes
import os
import pickle
import sys
import threading

from . import _lib
from ._lib import C_INT, C_PTR, C_SIZE, C_UINT64, XsegError, XsegOutOfMemoryError, check, int_arg
from .ipc import IpcHandle, block_handles, block_handles_release, ipc_close, ipc_export, ipc_import
from .registry import Registration, range_dmabuf, register_range, registration_safe, registration_stats
from .registry import nccl_comm, nccl_deregister, nccl_register, nccl_register_pool

__all__ = [
    "XsegError", "XsegOutOfMemoryError", "__version__", "library_path", "version",
    "init", "get_config", "set_config", "device_count",
    "malloc", "free", "record_stream", "caching_allocator_alloc", "caching_allocator_delete", "mem_get_info",
    "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "empty_cache", "set_per_process_memory_fraction",
    "memory_snapshot", "dump_snapshot", "attach_oom_observer", "check_stale", "stale_flush", "attach_stale_observer",
    "record_memory_history", "dump_snapshot_json", "dump_trace", "set_oom_snapshot",
    "_record_memory_history", "_dump_snapshot",
    "IpcHandle", "ipc_export", "ipc_import", "ipc_close", "block_handles", "block_handles_release",
    "register_range", "Registration", "range_dmabuf", "registration_stats", "registration_safe",
    "nccl_comm", "nccl_register", "nccl_register_pool", "nccl_deregister",
    "trim",
    "DEFAULT_POOL", "sleep", "wake", "sleep_stats", "set_pool_tag", "pool_tag", "shutdown", "group_members",
    "host_malloc", "host_free", "host_record_stream", "host_empty_cache", "host_memory_stats",
    "host_reset_peak_stats", "host_reset_accumulated_stats",
]

def __getattr__(name):
    # __version__ without loading libxseg at import: the version meson installed with the package
    # (from include/xseg.h), or in the source tree the loaded library's.
    if name == "__version__":
        try:
            from ._version import version
        except ImportError:
            version = globals()["version"]()
        return version
    raise AttributeError("module 'xseg' has no attribute %r" % (name,))


def library_path():
    """The path libxseg was loaded from."""
    return _lib.library_path()


def version():
    """The loaded library's version string (include/xseg.h's XSEG_API_VERSION)."""
    return _lib.lib().xseg_version().decode()


def _device(device, func, all_devices=False):
    """The device index for C: None is the current device; with @p all_devices, -1 (every
    device) is accepted too. Raises TypeError, ValueError or OverflowError naming @p func."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                if torch.cuda.is_initialized():
                    return torch.cuda.current_device()
            except Exception:  # a torch without CUDA: fall back to device 0
                pass
        return 0
    if isinstance(device, str):
        name, _, idx = device.partition(":")
        if name != "cuda" or (idx and not set(idx) <= set("0123456789")):
            raise ValueError("%s: device %r: expected 'cuda' or 'cuda:N'" % (func, device))
        return int_arg(func, "device", int(idx), C_INT, 0) if idx else _device(None, func)
    if not isinstance(device, int) and hasattr(device, "index"):
        if getattr(device, "type", "cuda") != "cuda":  # a torch.device
            raise ValueError("%s: device %r is not a CUDA device" % (func, device))
        return _device(device.index, func)
    return int_arg(func, "device", device, C_INT, -1 if all_devices else 0)


def _stream(stream, func):
    """A CUstream for C: None or 0 is the legacy default stream; torch and CuPy streams
    (objects with .cuda_stream or .ptr) are accepted, and integer handles."""
    if stream is None:
        return None
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            stream = getattr(stream, attr)
            break
    return int_arg(func, "stream", stream, C_PTR) or None


def _ptr(ptr, func, name="ptr"):
    """A device address for C (an int in [0, 2**64))."""
    return int_arg(func, name, ptr, C_PTR)


# --- configuration -------------------------------------------------------------------------

def init(config=None):
    """Initialize xseg now (it initializes lazily otherwise): load the driver ($XSEG_LIBCUDA,
    else libcuda.so.1) and apply `config`, or with None the first of $XSEG_ALLOC_CONF,
    $PYTORCH_CUDA_ALLOC_CONF and $PYTORCH_ALLOC_CONF that is set (a config given replaces the
    environment's; set_config() applies keys on top of the config in force). Calling it again
    re-applies the configuration. Raises XsegError for a bad key or value, or a driver that
    cannot be loaded."""
    check(_lib.lib().xseg_init(_lib.str_arg("xseg.init", "config", config, allow_none=True)))


def set_config(config):
    """Apply config keys (PyTorch's grammar, e.g. "expandable_segments:True,..."). Raises
    XsegError naming the bad key or value; nothing changes then."""
    check(_lib.lib().xseg_set_config(_lib.str_arg("xseg.set_config", "config", config)))


def get_config():
    """The config in force, as a string set_config accepts."""
    n = ctypes.c_size_t()
    check(_lib.lib().xseg_get_config(None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 1)
    check(_lib.lib().xseg_get_config(buf, len(buf), ctypes.byref(n)))
    return buf.value.decode()


def device_count():
    """Number of devices the driver reports."""
    n = ctypes.c_int()
    check(_lib.lib().xseg_device_count(ctypes.byref(n)))
    return n.value


# --- raw allocation (for users without torch, and the CuPy hook) ----------------------------

def malloc(size, device=None, stream=None):
    """Allocate `size` bytes on `device` for use on `stream`; returns the device address (int,
    0 for size 0). Free it with free()."""
    f = "xseg.malloc"
    size, dev, st = int_arg(f, "size", size, C_SIZE), _device(device, f), _stream(stream, f)
    p = ctypes.c_void_p()
    check(_lib.lib().xseg_malloc(ctypes.byref(p), size, dev, st))
    return p.value or 0


def free(ptr):
    """Free an address malloc() returned (a no-op for 0)."""
    check(_lib.lib().xseg_free(_ptr(ptr, "xseg.free") if ptr is not None else None))


def caching_allocator_alloc(size, device=None, stream=None):
    """torch.cuda.caching_allocator_alloc: malloc() under torch's name (the address, an int)."""
    return malloc(size, device, stream)


def caching_allocator_delete(mem_ptr):
    """torch.cuda.caching_allocator_delete: free() under torch's name."""
    free(mem_ptr)


def mem_get_info(device=None):
    """torch.cuda.mem_get_info(): (free, total) bytes of `device` as the driver reports them
    (cuMemGetInfo): free counts what xseg holds, cache included, as used."""
    f = "xseg.mem_get_info"
    dev = _device(device, f)
    free_b, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(_lib.need("xseg_mem_get_info")(dev, ctypes.byref(free_b), ctypes.byref(total)))
    return free_b.value, total.value


def record_stream(ptr, stream):
    """Mark a live block as used on `stream`: its memory is not reused before the work queued
    there when it is freed has completed (Tensor.record_stream)."""
    f = "xseg.record_stream"
    check(_lib.lib().xseg_record_stream(_ptr(ptr, f), _stream(stream, f)))


# --- statistics ----------------------------------------------------------------------------

def _stat_keys():
    keys = []
    k = ctypes.c_char_p()
    while True:
        check(_lib.lib().xseg_stat_key(len(keys), ctypes.byref(k)))
        if not k.value:
            return keys
        keys.append(k.value.decode())


def memory_stats(device=None):
    """torch.cuda.memory_stats(): the same keys (flattened, sorted) and meanings."""
    dev = _device(device, "xseg.memory_stats")
    out = []
    v = ctypes.c_int64()
    for key in _stat_keys():
        check(_lib.lib().xseg_stat(dev, key.encode(), ctypes.byref(v)))
        out.append((key, v.value))
    out.sort()
    return collections.OrderedDict(out)


def memory_stats_as_nested_dict(device=None):
    """torch.cuda.memory_stats_as_nested_dict(): "a.b.c" keys as nested dictionaries."""
    nested = {}
    for key, value in memory_stats(_device(device, "xseg.memory_stats_as_nested_dict")).items():
        node = nested
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return nested


def _one(key, device, func):
    v = ctypes.c_int64()
    check(_lib.lib().xseg_stat(_device(device, func), key.encode(), ctypes.byref(v)))
    return v.value


# --- pinned host memory ---------------------------------------------------------------------

def host_malloc(size):
    """Allocate `size` bytes of pinned host memory from xseg's caching host allocator; returns
    the address (int). Free it with host_free()."""
    p = ctypes.c_void_p()
    check(_lib.need("xseg_host_malloc")(ctypes.byref(p), int_arg("xseg.host_malloc", "size", size, C_SIZE)))
    return p.value


def host_free(ptr):
    """Return a block of host_malloc() to the cache (a no-op for 0 or None); it is reused once
    the streams given to host_record_stream() are done."""
    check(_lib.need("xseg_host_free")(_ptr(ptr, "xseg.host_free") if ptr else None))


def host_record_stream(ptr, stream, device=None):
    """Mark a pinned block as used by `stream` of `device` (a copy from or to it): its free
    waits for the work queued there (CachingHostAllocator's record_event)."""
    f = "xseg.host_record_stream"
    check(_lib.need("xseg_host_record_stream")(_ptr(ptr, f), _device(device, f), _stream(stream, f)))


def host_empty_cache():
    """Give every wholly free cached pinned segment back to the driver (sleep backups kept by
    sleep_keep_host_backup:True included)."""
    check(_lib.need("xseg_host_empty_cache")())


def host_reset_peak_stats():
    """torch.cuda.reset_peak_host_memory_stats(): each peak of host_memory_stats() becomes its
    current value (the times' .max and .min 0)."""
    check(_lib.need("xseg_host_reset_peak_stats")())


def host_reset_accumulated_stats():
    """torch.cuda.reset_accumulated_host_memory_stats(): the .allocated/.freed counts, the
    times' .total/.count and num_host_alloc/num_host_free become 0."""
    check(_lib.need("xseg_host_reset_accumulated_stats")())


def host_memory_stats():
    """torch.cuda.host_memory_stats(): the same keys (flattened, sorted)."""
    keys, k = [], ctypes.c_char_p()
    while True:
        check(_lib.need("xseg_host_stat_key")(len(keys), ctypes.byref(k)))
        if not k.value:
            break
        keys.append(k.value.decode())
    v, out = ctypes.c_int64(), []
    for key in keys:
        check(_lib.need("xseg_host_stat")(key.encode(), ctypes.byref(v)))
        out.append((key, v.value))
    out.sort()
    return collections.OrderedDict(out)


def memory_allocated(device=None):
    return _one("allocated_bytes.all.current", device, "xseg.memory_allocated")


def max_memory_allocated(device=None):
    return _one("allocated_bytes.all.peak", device, "xseg.max_memory_allocated")


def memory_reserved(device=None):
    return _one("reserved_bytes.all.current", device, "xseg.memory_reserved")


def max_memory_reserved(device=None):
    return _one("reserved_bytes.all.peak", device, "xseg.max_memory_reserved")


def reset_peak_memory_stats(device=None):
    """Reset every peak to its current value."""
    check(_lib.lib().xseg_reset_peak_stats(_device(device, "xseg.reset_peak_memory_stats")))


def reset_accumulated_memory_stats(device=None):
    """Restart the accumulated statistics from 0: every "allocated" and "freed" value and the
    num_* counts (torch.cuda.reset_accumulated_memory_stats). Current values and peaks stay."""
    dev = _device(device, "xseg.reset_accumulated_memory_stats")
    check(_lib.need("xseg_reset_accumulated_stats")(dev))


def memory_summary(device=None, abbreviated=False):
    """A readable table of the device's statistics (torch.cuda.memory_summary)."""
    dev = _device(device, "xseg.memory_summary")
    n = ctypes.c_size_t()
    check(_lib.lib().xseg_memory_summary(dev, None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 1)
    check(_lib.lib().xseg_memory_summary(dev, buf, len(buf), ctypes.byref(n)))
    return buf.value.decode()


def shutdown():
    """Give everything back (xseg_shutdown): every block xseg handed out is freed (its address
    must not be used again), private pools and IPC imports are released, every page, reservation
    and event goes back to the driver, history stops and is cleared, observers are detached, the
    configuration is back to its defaults and the idle-reclaim thread is joined. The next call
    initializes again. Raises XsegError (XSEG_ERROR_ILLEGAL_STATE) while a capture is under way
    or a pool sleeps; nothing changes then."""
    global _history_cb
    check(_lib.lib().xseg_shutdown())
    _observers.clear()  # detached: the library no longer calls them
    _history_cb = None


# --- cache control -------------------------------------------------------------------------

def empty_cache(device=-1):
    """Give every cached page that holds no live byte back to the driver (all devices by
    default, as torch.cuda.empty_cache does)."""
    check(_lib.lib().xseg_empty_cache(_device(device, "xseg.empty_cache", all_devices=True)))


# --- spill to host memory (spill_to_host:True) ---------------------------------------------

SPILL_NONE, SPILL_COLD = 0, 1
_LOCATIONS = {0: "device", 1: "host", 2: "mixed"}


def spill_hint(ptr, cold=True):
    """Declare the live block at `ptr` (what malloc returned) cold: you promise that nothing
    touches it (no kernel, copy or graph on any stream or thread) until spill_hint(ptr,
    cold=False) returns; spill_to_host may move its pages to host memory meanwhile.
    cold=False ends the declaration and brings its pages back before it returns (where the device
    has no room they stay on host memory, valid: block_location tells). Only declared blocks
    ever move (docs/services.md)."""
    f = "xseg.spill_hint"
    check(_lib.lib().xseg_spill_hint(_ptr(ptr, f), SPILL_COLD if cold else SPILL_NONE))


def promote(device=-1):
    """Move spilled pages of declared blocks back to device memory (all devices by default),
    giving the cache back first. Raises XsegError (XSEG_ERROR_OUT_OF_MEMORY) naming what stays on
    host memory when the device has no room. A block whose declaration ended comes back with its
    own spill_hint(ptr, cold=False)."""
    check(_lib.lib().xseg_promote(_device(device, "xseg.promote", all_devices=True)))


def block_location(ptr):
    """Where the live block at `ptr` is: ("device" | "host" | "mixed", bytes on host, the NUMA
    node of those bytes or -1 (none on host, or location HOST: the driver placed them))."""
    f = "xseg.block_location"
    loc, host, node = ctypes.c_int(), ctypes.c_size_t(), ctypes.c_int()
    check(_lib.lib().xseg_block_location(_ptr(ptr, f), ctypes.byref(loc), ctypes.byref(host), ctypes.byref(node)))
    return _LOCATIONS.get(loc.value, str(loc.value)), host.value, node.value


def trim(keep_bytes=0, device=-1):
    """Give cached memory back until at most `keep_bytes` of cache remain on each device (all
    initialized devices by default): the largest free runs first, only the pages needed
    (cudaMemPoolTrimTo's meaning)."""
    f = "xseg.trim"
    keep_bytes, dev = int_arg(f, "keep_bytes", keep_bytes, C_SIZE), _device(device, f, all_devices=True)
    fn = _lib.need("xseg_trim")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_size_t]
    check(fn(dev, keep_bytes))


class _GroupMember(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_int), ("ask_timeouts", ctypes.c_uint32), ("reserved_bytes", ctypes.c_uint64),
                ("allocated_bytes", ctypes.c_uint64), ("reclaimable_bytes", ctypes.c_uint64),
                ("budget_bytes", ctypes.c_uint64), ("gave_way_count", ctypes.c_uint64),
                ("gave_way_bytes", ctypes.c_uint64), ("asked_count", ctypes.c_uint64),
                ("foreign_bytes", ctypes.c_uint64), ("group_budget_bytes", ctypes.c_uint64)]


def group_members(device=None):
    """The members of the memory group (config key memory_group) this process's `device` is in,
    each a dict: pid, reserved_bytes, allocated_bytes, reclaimable_bytes, budget_bytes,
    gave_way_count, gave_way_bytes, asked_count, ask_timeouts (its asks a member never answered),
    foreign_bytes (its estimate of device memory it holds outside xseg), group_budget_bytes (as each last published, at most ~100 ms old).
    Raises XsegError when the device is in no group or went on alone (the message says why)."""
    f = "xseg.group_members"
    dev = _device(device, f)
    fn = _lib.need("xseg_group_stats")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_GroupMember), ctypes.c_size_t,
                   ctypes.POINTER(ctypes.c_size_t)]
    members = (_GroupMember * 64)()
    n = ctypes.c_size_t(0)
    check(fn(dev, members, 64, ctypes.byref(n)))
    return [{name: getattr(m, name) for name, _ in _GroupMember._fields_}
            for m in members[:min(n.value, 64)]]


# --- sleep and wake at the same addresses ---------------------------------------------------

DEFAULT_POOL = (0, 0)
"""The default pools of a device: every allocation not routed to a private pool."""


def _pool(pool, func):
    """A pool as xseg's id: DEFAULT_POOL, a (first, second) pair (torch's MempoolId_t, e.g.
    torch.cuda.graph_pool_handle()), or an object with an `.id` pair (torch.cuda.MemPool)."""
    if hasattr(pool, "id") and not isinstance(pool, (tuple, list)):
        pool = pool.id
    if not isinstance(pool, (tuple, list)) or len(pool) != 2:
        raise TypeError("%s: pool must be a pair of ints (or have an .id pair), not %r" % (func, pool))
    return _lib.PoolId(int_arg(func, "pool[0]", pool[0], C_UINT64), int_arg(func, "pool[1]", pool[1], C_UINT64))


def _tag_bytes(tag, func):
    """A tag as the C API takes it: str or bytes of 1 to 31 characters of [A-Za-z0-9_.-] (the library
    checks the characters and names what was wrong)."""
    if isinstance(tag, str):
        tag = tag.encode("utf-8", "replace")
    if not isinstance(tag, bytes):
        raise TypeError("%s: a tag must be str or bytes, not %s" % (func, type(tag).__name__))
    if b"\0" in tag:
        raise ValueError("%s: tag %r has a NUL byte" % (func, tag))
    return tag


def _tag_list(tags, func):
    if isinstance(tags, (str, bytes)):
        tags = [tags]
    try:
        out = [_tag_bytes(t, func) for t in tags]
    except TypeError:
        if not hasattr(tags, "__iter__"):
            raise TypeError("%s: tags must be a tag or an iterable of tags, not %s"
                            % (func, type(tags).__name__)) from None
        raise
    if not out:
        raise ValueError("%s: tags is empty" % func)
    return out


def set_pool_tag(pool, tag, device=None):
    """Tag `pool` of `device` (DEFAULT_POOL, a (first, second) pair, or a torch.cuda.MemPool / graph
    pool handle) with `tag` ("weights", "kv_cache", "graphs" or a name of your own: 1 to 31 letters,
    digits, '_', '.', '-'); None clears it. The pool need not have allocated yet (tag a MemPool when
    you make it). sleep(tags=...) and wake(tags=...) then act on every pool of a tag."""
    f = "xseg.set_pool_tag"
    pid, dev = _pool(pool, f), _device(device, f)
    check(_lib.need("xseg_pool_set_tag")(dev, pid, None if tag is None else _tag_bytes(tag, f)))


def pool_tag(pool, device=None):
    """The tag of `pool` on `device` (None when it carries none)."""
    f = "xseg.pool_tag"
    pid, dev = _pool(pool, f), _device(device, f)
    buf = ctypes.create_string_buffer(_lib.TAG_MAX)
    check(_lib.need("xseg_pool_get_tag")(dev, pid, buf, _lib.TAG_MAX))
    return buf.value.decode() or None


def _sleep_tags(tags, offload, device):
    f = "xseg.sleep"
    names = _tag_list(tags, f)
    if isinstance(offload, bool):
        keep = set(names) if offload else set()
    elif isinstance(offload, (str, bytes)):
        keep = {_tag_bytes(offload, f)}
    else:
        try:
            keep = {_tag_bytes(t, f) for t in offload}
        except TypeError:
            raise TypeError("xseg.sleep: with tags, offload is True, False or the tags to offload, not %s"
                            % type(offload).__name__) from None
    extra = keep - set(names)
    if extra:
        raise ValueError("xseg.sleep: offload names %s, not among tags %s"
                         % (sorted(t.decode() for t in extra), [t.decode() for t in names]))
    arr = (_lib.TagSleep * len(names))(*[
        _lib.TagSleep(t, _lib.SLEEP_OFFLOAD if t in keep else _lib.SLEEP_DISCARD) for t in names])
    check(_lib.need("xseg_sleep_tags")(_device(device, f), arr, len(names)))


def sleep(pool=DEFAULT_POOL, device=None, offload=True, path=None, tags=None):
    """Put `pool` of `device` to sleep: give back the device memory of every page it has mapped,
    live blocks and cache alike, while its virtual addresses stay reserved (pointers and CUDA
    graphs stay valid). With `offload` (the default) the live blocks' bytes wait in pinned host
    memory; without, they are dropped and read zero after the wake. Waits for the pool's streams
    first. While asleep, freeing works and allocating from the pool raises XsegError
    (XSEG_ERROR_ILLEGAL_STATE); the memory must not be touched. Raises XsegError when the pool
    sleeps already, a capture is underway, or it holds classic (non-expandable) segments
    (XSEG_ERROR_NOT_SUPPORTED); a failed sleep leaves the pool awake with its data.
    With `path` (str, bytes or os.PathLike) the bytes go to a new file there instead, created
    0600 (an existing file or a symbolic link is refused: XsegError), read back and removed by
    wake() (xseg_sleep_ex, XSEG_SLEEP_OFFLOAD_FILE).
    With `tags` (a tag or a list of them; see set_pool_tag) every pool of `device` carrying one of
    them sleeps instead of `pool` (xseg_sleep_tags): `offload` is then True (offload all), False
    (discard all) or the tags to offload, the others being discarded. vLLM's level 1 is
    sleep(tags=["weights", "kv_cache", "graphs"], offload=["weights"]), level 2 offload=False.
    All or nothing: every pool is checked first, and a failure wakes those already asleep."""
    if tags is not None:
        if path is not None or pool is not DEFAULT_POOL:
            raise ValueError("xseg.sleep: tags choose the pools; give no pool or path with them")
        _sleep_tags(tags, offload, device)
        return
    pid, dev = _pool(pool, "xseg.sleep"), _device(device, "xseg.sleep")
    if path is None:
        flags = _lib.SLEEP_OFFLOAD if offload else _lib.SLEEP_DISCARD
        check(_lib.need("xseg_sleep")(dev, pid, flags))
        return
    if not offload:
        raise ValueError("xseg.sleep: a path keeps the bytes in a file, so it needs offload=True")
    try:
        raw = os.fsencode(path)
    except TypeError:
        raise TypeError("xseg.sleep: path must be str, bytes or os.PathLike, not %s" % type(path).__name__) from None
    if not raw or b"\0" in raw:
        raise ValueError("xseg.sleep: path must be a non-empty file name without NUL bytes, got %r" % (path,))
    check(_lib.need("xseg_sleep_ex")(dev, pid, _lib.SLEEP_OFFLOAD_FILE, raw))


def wake(pool=DEFAULT_POOL, device=None, tags=None):
    """Wake `pool` of `device`: map its pages at the same addresses again and restore its live
    blocks (or zeros after sleep(offload=False)). Raises XsegError when it is not asleep, or when
    the memory is not there (XsegOutOfMemoryError): then it stays asleep and can be woken later.
    With `tags`, the sleeping pools carrying them instead, tag by tag in the order given
    (xseg_wake_tags: wake(tags=["weights"]) first, then wake(tags=["kv_cache", "graphs"])); awake
    pools of those tags are left alone, so a wake that failed part way is retried the same way."""
    f = "xseg.wake"
    if tags is not None:
        if pool is not DEFAULT_POOL:
            raise ValueError("xseg.wake: tags choose the pools; give no pool with them")
        names = _tag_list(tags, f)
        arr = (ctypes.c_char_p * len(names))(*names)
        check(_lib.need("xseg_wake_tags")(_device(device, f), arr, len(names)))
        return
    pid, dev = _pool(pool, f), _device(device, f)
    check(_lib.need("xseg_wake")(dev, pid))


def sleep_stats(pool=None, device=None):
    """What sleeps: for `pool`, or summed over every pool of `device` when `pool` is None.
    Keys: asleep (pools asleep), offload (bool, one pool), released_bytes (device memory given
    back), offloaded_bytes (live bytes kept in pinned host memory), discarded_bytes, num_sleeps,
    num_wakes (the device's)."""
    st = _lib.SleepStats()
    ref = ctypes.byref(_pool(pool, "xseg.sleep_stats")) if pool is not None else None
    dev = _device(device, "xseg.sleep_stats")
    check(_lib.need("xseg_get_sleep_stats")(dev, ref, ctypes.byref(st)))
    out = {k: getattr(st, k) for k, _ in _lib.SleepStats._fields_ if k != "flags"}
    if pool is not None:
        out["offload"] = st.flags in (_lib.SLEEP_OFFLOAD, _lib.SLEEP_OFFLOAD_FILE)
        out["to_file"] = st.flags == _lib.SLEEP_OFFLOAD_FILE
    return out


def set_per_process_memory_fraction(fraction, device=None):
    """Cap this process's reserved memory on `device` at `fraction` of its total; beyond it
    allocations fail with out-of-memory."""
    f = "xseg.set_per_process_memory_fraction"
    fraction, dev = _lib.float_arg(f, "fraction", fraction, 0.0, 1.0), _device(device, f)
    check(_lib.lib().xseg_set_memory_fraction(fraction, dev))


# --- snapshots -----------------------------------------------------------------------------

_STATES = {0: "inactive", 1: "active_allocated", 2: "active_pending_free"}


def _pool_segments(segments, mempool_id):
    """The segments of pool @p mempool_id (a (first, second) pair, as torch.cuda.MemPool.id);
    None: all."""
    if mempool_id is None:
        return segments
    try:
        want = (int(mempool_id[0]), int(mempool_id[1]))
    except (TypeError, ValueError, IndexError):
        raise TypeError("mempool_id must be a pair of integers (a MemPool's .id), got %r" % (mempool_id,))
    return [s for s in segments if tuple(s.get("segment_pool_id", (0, 0))) == want]


def memory_snapshot(device=-1, mempool_id=None):
    """torch.cuda.memory_snapshot(): a list of segment dictionaries with their blocks, in
    PyTorch's field names (all devices by default; only pool @p mempool_id's segments when given,
    as MemPool.snapshot() asks)."""
    snap = ctypes.POINTER(_lib.Snapshot)()
    lib = _lib.lib()
    dev = _device(device, "xseg.memory_snapshot", all_devices=True)
    check(lib.xseg_take_snapshot(dev, ctypes.byref(snap)))
    try:
        segs = []
        for i in range(snap.contents.nsegments):
            s = snap.contents.segments[i]
            blocks = []
            for j in range(s.nblocks):
                b = s.blocks[j]
                blocks.append({"address": b.address, "size": b.size,
                               "requested_size": b.requested_size,
                               "state": _STATES.get(b.state, "inactive"), "frames": []})
                if b.host_bytes:  # spill_to_host: bytes of the block on host memory, and their node
                    blocks[-1]["host_bytes"] = b.host_bytes
                    blocks[-1]["host_numa_node"] = b.host_numa_node
            segs.append({
                "device": s.device, "address": s.address, "total_size": s.total_size,
                "allocated_size": s.allocated_size, "active_size": s.active_size,
                "requested_size": s.requested_size, "stream": s.stream or 0,
                "segment_type": "large" if s.is_large else "small",
                "segment_pool_id": (s.pool_id[0], s.pool_id[1]),
                "is_expandable": bool(s.is_expandable), "frames": [], "blocks": blocks})
        return _pool_segments(segs, mempool_id)
    finally:
        lib.xseg_snapshot_free(snap)


def _snapshot(device=-1):
    """The dictionary torch.cuda.memory._snapshot() returns (segments, device_traces with the
    recorded history, frames), read back from xseg_dump_snapshot's pickle."""
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".pickle")
    os.close(fd)
    try:
        dump_snapshot(path, device)
        with open(path, "rb") as f:
            return pickle.load(f)
    finally:
        os.unlink(path)


def dump_snapshot(path="dump_snapshot.pickle", device=-1):
    """Write the pickle torch.cuda.memory._dump_snapshot writes, with the recorded history's
    events and frames (readable by PyTorch's _memory_viz.py and https://pytorch.org/memory_viz).
    All devices by default."""
    f = "xseg.dump_snapshot"
    path, dev = _lib.path_arg(f, "path", path), _device(device, f, all_devices=True)
    check(_lib.need("xseg_dump_snapshot")(dev, path))


def dump_snapshot_json(path, device=-1):
    """dump_snapshot's content as JSON."""
    f = "xseg.dump_snapshot_json"
    path, dev = _lib.path_arg(f, "path", path), _device(device, f, all_devices=True)
    check(_lib.need("xseg_dump_snapshot_json")(dev, path))


def dump_trace(path, device=-1):
    """Write the recorded history as an xseg-replay trace, to replay this program's allocations
    under other settings (`xseg-replay --compare PATH`)."""
    f = "xseg.dump_trace"
    path, dev = _lib.path_arg(f, "path", path), _device(device, f, all_devices=True)
    check(_lib.need("xseg_dump_trace")(dev, path))


def set_oom_snapshot(path):
    """Write a snapshot to `path` when an out-of-memory error surfaces (None: off)."""
    path = _lib.path_arg("xseg.set_oom_snapshot", "path", path, allow_none=True)
    check(_lib.need("xseg_set_oom_snapshot")(path))


# --- allocation history --------------------------------------------------------------------

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_history_cb = None  # the ctypes callback in force (must outlive its use by the library)
_frames_tls = threading.local()  # each thread's last frame strings, alive until xseg copied them


def _python_frames(frames, max_frames, user):
    """xseg's stack callback: the calling thread's Python frames, innermost first, skipping the
    package's own wrappers so the first frame is the caller's line."""
    keep = []  # xseg copies the strings after we return: they stay alive until this thread's next call
    n = 0
    try:
        f = sys._getframe(1)
        while f is not None and n < max_frames:
            code = f.f_code
            if os.path.dirname(os.path.abspath(code.co_filename)) != _PKG_DIR:
                fn = os.fsencode(code.co_filename)
                name = code.co_name.encode("utf-8", "replace")
                keep += (fn, name)
                frames[n].filename = fn
                frames[n].name = name
                frames[n].line = f.f_lineno or 0
                n += 1
            f = f.f_back
    except Exception:
        pass
    _frames_tls.keep = keep
    return n


_ENABLED = {"all": _lib.HISTORY_ALL, "state": _lib.HISTORY_STATE}


def record_memory_history(enabled="all", context="all", stacks="python", max_entries=sys.maxsize,
                          device=None, clear_history=False, max_frames=16):
    """torch.cuda.memory._record_memory_history: start, change or stop recording allocation
    history, process-wide. PyTorch's argument forms map onto xseg_record_memory_history:

    enabled: "all" (or True) records the trace (the snapshot's device_traces, the viewer's
    timeline) and each live block's allocation frames (XSEG_HISTORY_ALL); "state" only the live
    blocks' frames, no trace (XSEG_HISTORY_STATE); None (or False) stops (what was recorded stays).
    context: None records no frames; "state", "alloc" and "all" record them (xseg's events carry
    the allocation's frames, so the three differ only in PyTorch). stacks: "python" (the default
    here; PyTorch's is "all") takes this interpreter's frames through xseg's stack callback; "all"
    adds the C frames (XSEG_STACKS_C). max_entries bounds the trace ring (sys.maxsize, PyTorch's
    "no limit", and 0: xseg's default, 100000 events). clear_history drops what was recorded.
    `device` is accepted for PyTorch's signature (history is process-wide; a bad one still raises).
    An invalid value raises ValueError (TypeError for a wrong type) naming the argument."""
    global _history_cb
    f = "xseg.record_memory_history"
    if device is not None:
        _device(device, f)  # history is process-wide; a bad device is still an error
    if enabled is True:  # PyTorch's bool form (True == 1: test identity, before the dict lookup)
        enabled = "all"
    elif enabled is False:
        enabled = None
    opts = _lib.HistoryOptions()
    if enabled is None:
        opts.enabled = 0
    else:
        if not isinstance(enabled, str) or enabled not in _ENABLED:
            raise ValueError("%s: enabled must be None, False, True, 'state' or 'all', not %r"
                             % (f, enabled))
        if context is not None and (not isinstance(context, str) or context not in ("state", "alloc", "all")):
            raise ValueError("%s: context must be None, 'state', 'alloc' or 'all', not %r" % (f, context))
        if not isinstance(stacks, str) or stacks not in ("python", "all"):
            raise ValueError("%s: stacks must be 'python' or 'all', not %r" % (f, stacks))
        opts.enabled = 1
        opts.record = _ENABLED[enabled]
        if context is not None:
            opts.stacks = _lib.STACKS_CALLBACK | (_lib.STACKS_C if stacks == "all" else 0)
            _history_cb = _history_cb or _lib.STACK_CALLBACK(_python_frames)
            opts.callback = _history_cb
        # sys.maxsize (torch's default, "no limit") and beyond: xseg's default bound.
        if isinstance(max_entries, int) and not isinstance(max_entries, bool) and max_entries >= sys.maxsize:
            max_entries = 0
        opts.max_entries = int_arg(f, "max_entries", max_entries, C_SIZE)
        opts.max_frames = int_arg(f, "max_frames", max_frames, C_INT, 0)
    opts.clear = 1 if clear_history else 0
    check(_lib.need("xseg_record_memory_history")(ctypes.byref(opts)))


# --- observers -----------------------------------------------------------------------------

_observers = []  # ctypes callbacks must outlive the library's use of them


# torch.cuda.memory's own spellings, so that code written for it runs with `import xseg as ...`.
_record_memory_history = record_memory_history
_dump_snapshot = dump_snapshot


def attach_oom_observer(fn):
    """Call fn(device, requested, device_total, device_free) when an allocation fails after
    recovery (before the error is returned). Exceptions from fn are printed, not raised."""
    if not callable(fn):
        raise TypeError("fn must be callable")

    def tramp(device, requested, total, free_, user):
        try:
            fn(device, requested, total, free_)
        except Exception:  # an exception cannot cross the C frame
            import traceback
            traceback.print_exc()

    cb = _lib.OOM_OBSERVER(tramp)
    check(_lib.lib().xseg_attach_oom_observer(cb, None))
    _observers.append(cb)


def _frames(arr, n):
    return [{"filename": (arr[i].filename or b"").decode("utf-8", "replace"),
             "name": (arr[i].name or b"").decode("utf-8", "replace"), "line": arr[i].line}
            for i in range(n)]


def attach_stale_observer(fn):
    """Call fn(report) for each stale access the debug mode finds (config key
    debug_stale_access:True; docs/troubleshooting.md): a dict with device, address, size,
    requested_size, stream, pool ("small"/"large"; "host" with device -1: a pinned block of
    host_malloc), expandable, first_offset, freed_us,
    found_us, when, alloc_frames and free_frames (lists of {filename, name, line}, innermost
    first) and message. While one is attached, reports no longer go to stderr. Exceptions from
    fn are printed, not raised."""
    if not callable(fn):
        raise TypeError("fn must be callable")

    def tramp(rp, user):
        try:
            r = rp.contents
            fn({"device": r.device, "address": r.addr, "size": r.size, "requested_size": r.requested,
                "stream": r.stream or 0, "pool": (r.pool or b"").decode(), "expandable": bool(r.expandable),
                "first_offset": r.first_offset, "freed_us": r.freed_us, "found_us": r.found_us,
                "when": (r.when or b"").decode(),
                "alloc_frames": _frames(r.alloc_frames, r.n_alloc_frames),
                "free_frames": _frames(r.free_frames, r.n_free_frames),
                "message": (r.message or b"").decode("utf-8", "replace")})
        except Exception:  # an exception cannot cross the C frame
            import traceback
            traceback.print_exc()

    cb = _lib.STALE_OBSERVER(tramp)
    check(_lib.need("xseg_attach_stale_observer")(cb, None))
    _observers.append(cb)


def check_stale(device=None):
    """Check every block the debug mode (debug_stale_access:True) holds in quarantine on
    `device` now, and the pinned host cache's (host_malloc blocks): each one written since its
    free is reported (observers, else stderr) once. Returns how many this call found. Raises XsegError (ILLEGAL_STATE) during a capture."""
    found = ctypes.c_size_t(0)
    check(_lib.need("xseg_check_stale")(_device(device, "xseg.check_stale"), ctypes.byref(found)))
    return found.value


def stale_flush(device=None):
    """Fill the quarantined blocks whose fills wait for their batch (debug_stale_fill_batch) on
    `device` now, so that a CUDA graph replayed next meets the pattern (xseg.torch calls it before
    every CUDAGraph.replay). Queued on the blocks' streams; nothing waits. Raises XsegError
    (ILLEGAL_STATE) during a capture."""
    check(_lib.need("xseg_stale_flush")(_device(device, "xseg.stale_flush")))
