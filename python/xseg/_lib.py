"""Loading libxseg and declaring the C functions the package calls (ctypes, standard library only).

The library is found in this package's own installation first (the LIBDIR `meson install`
recorded, or beside the package where a pip install bundles it), then through $XSEG_LIBRARY, then
the system's loader path. Every call that returns an xseg_status goes through `check`, which
turns a failure into XsegError carrying the library's own message.
"""
import ctypes
import ctypes.util
import glob
import math
import operator
import os
import threading

__all__ = ["XsegError", "lib", "check", "library_path", "emulator_path", "int_arg", "str_arg", "path_arg"]

# xseg_status values (include/xseg.h)
SUCCESS = 0
STATUS_NAMES = {
    0: "XSEG_SUCCESS",
    1: "XSEG_ERROR_INVALID_VALUE",
    2: "XSEG_ERROR_OUT_OF_MEMORY",
    3: "XSEG_ERROR_DRIVER",
    4: "XSEG_ERROR_INVALID_DEVICE",
    5: "XSEG_ERROR_ILLEGAL_STATE",
    6: "XSEG_ERROR_NOT_SUPPORTED",
}


class XsegError(RuntimeError):
    """A failed xseg call: `status` is the xseg_status code, `status_name` its name, and the
    message is xseg_last_error() of the failing call."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = STATUS_NAMES.get(status, "status %d" % status)
        super().__init__("%s: %s" % (self.status_name, message))


class XsegOutOfMemoryError(XsegError, MemoryError):
    """XSEG_ERROR_OUT_OF_MEMORY (also a MemoryError, as torch.cuda.OutOfMemoryError is)."""


def _own():
    """The libxseg of this package's own installation: the LIBDIR `meson install` recorded in
    _version.py (relative to the package, so a DESTDIR or moved prefix still matches), then beside
    the package (a copy installed into it, or meson-python's bundled-library folder of a wheel)."""
    here = os.path.dirname(os.path.abspath(__file__))
    folders = []
    try:
        from ._version import libdir
    except ImportError:  # the source tree: no installation of its own
        libdir = ""
    if libdir:
        folders.append(os.path.normpath(os.path.join(here, libdir)))
    folders += [here, os.path.join(os.path.dirname(here), ".xseg.mesonpy.libs")]
    for folder in folders:
        names = glob.glob(os.path.join(folder, "libxseg.so*"))
        # The runtime name first (libxseg.so.0), then the rest: libxseg.so is a development link.
        for name in sorted(names, key=lambda n: (os.path.basename(n) != "libxseg.so.0", n)):
            yield name


def _candidates():
    # 1. the installation's own library: a package never pairs with another version by accident
    for name in _own():
        yield name
    # 2. $XSEG_LIBRARY: an explicit choice is never second-guessed: if it does not load, that is
    # the error (the system's library is not tried behind it)
    env = os.environ.get("XSEG_LIBRARY")
    if env:
        yield env
        return
    # 3. the system's loader path
    found = ctypes.util.find_library("xseg")
    yield found or "libxseg.so.0"


_lock = threading.Lock()
_lib = None
_path = None


def _load():
    global _lib, _path
    tried = []
    for cand in _candidates():
        try:
            handle = ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s (%s)" % (cand, e))
            continue
        _declare(handle)
        _lib, _path = handle, cand
        return
    raise OSError("xseg: cannot load libxseg; tried " + "; ".join(tried) +
                  ". Set XSEG_LIBRARY to the path of libxseg.so.")


def emulator_path():
    """The emulated driver (cudaemu) this package's installation carries, or None: beside the
    package (a wheel) or in LIBDIR/xseg (meson install)."""
    here = os.path.dirname(os.path.abspath(__file__))
    folders = [here]
    try:
        from ._version import libdir
    except ImportError:
        libdir = ""
    if libdir:
        folders.append(os.path.join(os.path.normpath(os.path.join(here, libdir)), "xseg"))
    for folder in folders:
        path = os.path.join(folder, "libcudaemu.so")
        if os.path.isfile(path):
            return path
    return None


def _choose_driver():
    """Before libxseg first loads a driver: where no GPU driver loads (libcuda.so.1) and
    $XSEG_LIBCUDA is unset, run on the emulator the package carries, with one line on stderr, as
    xseg-replay does: `pip install` and the README's snippet work on a laptop.
    $XSEG_EMULATOR: "auto" (default), "1" (always the emulator), "0" (never: a missing driver is
    the error it is)."""
    want = os.environ.get("XSEG_EMULATOR", "auto").strip().lower()
    if want not in ("auto", "1", "0"):
        raise ValueError("XSEG_EMULATOR=%r: expected auto, 1 or 0" % want)
    if os.environ.get("XSEG_LIBCUDA"):
        return
    if want == "0":
        return
    emu = emulator_path()
    if want == "auto":
        try:
            ctypes.CDLL("libcuda.so.1")
            return
        except OSError:
            pass
        if emu is None:
            return  # libxseg's own error then says what to set
        import sys
        sys.stderr.write("xseg: no GPU driver (libcuda.so.1) loads here: running on the emulator this package "
                         "carries (%s; device memory is host memory; XSEG_EMULATOR=0 turns this off)\n" % emu)
    elif emu is None:
        raise OSError("xseg: XSEG_EMULATOR=1, but this installation carries no emulator (libcudaemu.so): set "
                      "XSEG_LIBCUDA to the path of one (a build's cudaemu/libcudaemu.so)")
    os.environ["XSEG_LIBCUDA"] = emu


def lib():
    """The loaded libxseg (ctypes.CDLL), loaded on first use (the driver chosen first:
    _choose_driver)."""
    if _lib is None:
        with _lock:
            if _lib is None:
                _choose_driver()
                _load()
    return _lib


def library_path():
    """The path libxseg was loaded from."""
    lib()
    return _path


def last_error():
    return (lib().xseg_last_error() or b"").decode("utf-8", "replace")


def check(status):
    """Raise XsegError for a non-success status, with xseg_last_error() as the message."""
    if status != SUCCESS:
        msg = last_error()
        if status == 2:
            raise XsegOutOfMemoryError(status, msg)
        raise XsegError(status, msg)
    return status


# --- arguments: checked here, because ctypes wraps integers silently ------------------------
#
# ctypes converts a Python int to a C integer modulo 2**bits (2**64 + 4096 becomes 4096 for a
# size_t, -1 becomes SIZE_MAX) and a str to a C string that ends at its first NUL. Every
# argument a public function passes to libxseg goes through one of these first, so a value that
# C cannot hold exactly raises instead, naming the function and the argument.

# The C types' ranges, [lo, hi).
C_INT = (-2**31, 2**31)
C_UINT = (0, 2**32)
C_SIZE = (0, 2**64)
C_UINT64 = (0, 2**64)
C_PTR = (0, 2**64)  # an address or handle (a CUstream, a device pointer)


def _power(v):
    """-2**31, 2**64, 0 ...: a bound as a reader would write it."""
    for sign, a in ((1, v), (-1, -v)):
        if a > 1 and a & (a - 1) == 0:
            return "%s2**%d" % ("-" if sign < 0 else "", a.bit_length() - 1)
    return str(v)


def int_arg(func, name, value, ctype=C_SIZE, lo=None):
    """@p value as a Python int that the C type @p ctype (a [lo, hi) pair above) holds exactly,
    at least @p lo (the domain's minimum: 0 for a device, -1 where -1 means every device).
    Raises TypeError for anything that is not an integer (bool included: True is not a size),
    ValueError below @p lo (a negative size), OverflowError outside the C type (above its
    maximum, or below a signed type's minimum); each message names @p func and
    @p name ("xseg.malloc: size must be 0 <= size < 2**64, got -1")."""
    c_lo, c_hi = ctype
    lo = c_lo if lo is None else lo
    want = "%s <= %s < %s" % (_power(lo), name, _power(c_hi))
    if isinstance(value, bool):
        raise TypeError("%s: %s must be an integer (%s), not bool" % (func, name, want))
    try:
        v = operator.index(value)  # int, or an object that is one (numpy and torch integers)
    except TypeError:
        raise TypeError("%s: %s must be an integer (%s), not %s %r"
                        % (func, name, want, type(value).__name__, value)) from None
    if v < lo:  # a negative size or device: ValueError (past a signed type's minimum: overflow)
        err = OverflowError if lo == c_lo < 0 else ValueError
        raise err("%s: %s must be %s, got %d" % (func, name, want, v))
    if v >= c_hi:
        raise OverflowError("%s: %s must be %s, got %d" % (func, name, want, v))
    return v


def float_arg(func, name, value, lo, hi):
    """@p value as a float in [lo, hi] (an int or a float, not bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("%s: %s must be a float, not %s" % (func, name, type(value).__name__))
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not lo <= v <= hi:
        raise ValueError("%s: %s must be %g <= %s <= %g, got %r" % (func, name, lo, name, hi, value))
    return v


def _no_nul(func, name, b):
    i = b.find(b"\0")
    if i >= 0:
        raise ValueError("%s: %s contains a NUL character (at byte %d), which C would take as its "
                         "end" % (func, name, i))
    return b


def str_arg(func, name, value, allow_none=False):
    """A str for a C string argument, as UTF-8 bytes: TypeError for anything else (None too unless
    @p allow_none), ValueError for a NUL in it or a character UTF-8 cannot encode."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise TypeError("%s: %s must be a str, not %s" % (func, name, type(value).__name__))
    try:
        b = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError("%s: %s cannot be encoded as UTF-8 (%s)" % (func, name, e.reason)) from None
    return _no_nul(func, name, b)


def path_arg(func, name, value, allow_none=False):
    """A file system path (str, bytes or os.PathLike) as the bytes the C library opens:
    TypeError for anything else, ValueError for a NUL in it or a name the file system encoding
    cannot encode."""
    if value is None and allow_none:
        return None
    try:
        p = os.fspath(value)
    except TypeError:
        raise TypeError("%s: %s must be a path (str, bytes or os.PathLike), not %s"
                        % (func, name, type(value).__name__)) from None
    try:
        b = os.fsencode(p)
    except UnicodeEncodeError as e:
        raise ValueError("%s: %s cannot be encoded for the file system (%s)" % (func, name, e.reason)) from None
    return _no_nul(func, name, b)


c_size_p = ctypes.POINTER(ctypes.c_size_t)
c_int64_p = ctypes.POINTER(ctypes.c_int64)


class StatCounter(ctypes.Structure):
    _fields_ = [("current", ctypes.c_int64), ("peak", ctypes.c_int64),
                ("allocated", ctypes.c_int64), ("freed", ctypes.c_int64)]


class BlockInfo(ctypes.Structure):
    _fields_ = [("address", ctypes.c_uint64), ("size", ctypes.c_size_t),
                ("requested_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("host_bytes", ctypes.c_size_t), ("host_numa_node", ctypes.c_int)]


class SegmentInfo(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("address", ctypes.c_uint64),
                ("total_size", ctypes.c_size_t), ("allocated_size", ctypes.c_size_t),
                ("active_size", ctypes.c_size_t), ("requested_size", ctypes.c_size_t),
                ("stream", ctypes.c_void_p), ("is_large", ctypes.c_int),
                ("is_expandable", ctypes.c_int), ("pool_id", ctypes.c_uint64 * 2),
                ("nblocks", ctypes.c_size_t), ("blocks", ctypes.POINTER(BlockInfo))]


class Snapshot(ctypes.Structure):
    _fields_ = [("nsegments", ctypes.c_size_t), ("segments", ctypes.POINTER(SegmentInfo))]


class PoolId(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]


OOM_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t,
                                ctypes.c_size_t, ctypes.c_void_p)

_S = ctypes.c_int  # xseg_status

# name: (restype, argtypes). Optional entries (newer libraries) are declared when present.
_PROTOS = {
    "xseg_last_error": (ctypes.c_char_p, []),
    "xseg_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "xseg_version": (ctypes.c_char_p, []),
    "xseg_init": (_S, [ctypes.c_char_p]),
    "xseg_set_config": (_S, [ctypes.c_char_p]),
    "xseg_get_config": (_S, [ctypes.c_char_p, ctypes.c_size_t, c_size_p]),
    "xseg_device_count": (_S, [ctypes.POINTER(ctypes.c_int)]),
    "xseg_shutdown": (_S, []),
    "xseg_malloc": (_S, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_void_p]),
    "xseg_free": (_S, [ctypes.c_void_p]),
    "xseg_record_stream": (_S, [ctypes.c_void_p, ctypes.c_void_p]),
    "xseg_empty_cache": (_S, [ctypes.c_int]),
    "xseg_spill_hint": (_S, [ctypes.c_void_p, ctypes.c_int]),
    "xseg_promote": (_S, [ctypes.c_int]),
    "xseg_block_location": (_S, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), c_size_p,
                                 ctypes.POINTER(ctypes.c_int)]),
    "xseg_set_memory_fraction": (_S, [ctypes.c_double, ctypes.c_int]),
    "xseg_enable_peer_access": (_S, [ctypes.c_int, ctypes.c_int]),
    "xseg_stat": (_S, [ctypes.c_int, ctypes.c_char_p, c_int64_p]),
    "xseg_stat_key": (_S, [ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p)]),
    "xseg_reset_peak_stats": (_S, [ctypes.c_int]),
    "xseg_reset_accumulated_stats": (_S, [ctypes.c_int]),
    "xseg_memory_summary": (_S, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, c_size_p]),
    "xseg_mem_get_info": (_S, [ctypes.c_int, c_size_p, c_size_p]),
    "xseg_take_snapshot": (_S, [ctypes.c_int, ctypes.POINTER(ctypes.POINTER(Snapshot))]),
    "xseg_snapshot_free": (None, [ctypes.POINTER(Snapshot)]),
    "xseg_attach_oom_observer": (_S, [OOM_OBSERVER, ctypes.c_void_p]),
    "xseg_pool_create": (_S, [ctypes.POINTER(PoolId)]),
    "xseg_release_pool": (_S, [ctypes.c_int, PoolId]),
    "xseg_torch_adapter_attached": (None, [ctypes.c_int]),
}


def _declare(handle):
    for name, (res, args) in _PROTOS.items():
        fn = getattr(handle, name, None)
        if fn is None:
            continue
        fn.restype = res
        fn.argtypes = args


# --- allocation history (include/xseg.h: xseg_record_memory_history) ---------------------------

class Frame(ctypes.Structure):
    _fields_ = [("filename", ctypes.c_char_p), ("name", ctypes.c_char_p), ("line", ctypes.c_int)]


STACK_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Frame), ctypes.c_int, ctypes.c_void_p)


class HistoryOptions(ctypes.Structure):
    _fields_ = [("enabled", ctypes.c_int), ("record", ctypes.c_int), ("stacks", ctypes.c_int),
                ("max_entries", ctypes.c_size_t), ("max_frames", ctypes.c_int),
                ("callback", STACK_CALLBACK), ("user", ctypes.c_void_p), ("clear", ctypes.c_int)]


HISTORY_ALL, HISTORY_STATE, HISTORY_TRACE = 0, 1, 2
STACKS_NONE, STACKS_C, STACKS_CALLBACK = 0, 1, 2

# --- stale-access debug mode (include/xseg.h: xseg_stale_report) -----------------------------

class StaleReport(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("addr", ctypes.c_size_t), ("size", ctypes.c_size_t),
                ("requested", ctypes.c_size_t), ("stream", ctypes.c_void_p), ("pool", ctypes.c_char_p),
                ("expandable", ctypes.c_int), ("first_offset", ctypes.c_size_t),
                ("freed_us", ctypes.c_int64), ("found_us", ctypes.c_int64), ("when", ctypes.c_char_p),
                ("alloc_frames", ctypes.POINTER(Frame)), ("n_alloc_frames", ctypes.c_int),
                ("free_frames", ctypes.POINTER(Frame)), ("n_free_frames", ctypes.c_int),
                ("message", ctypes.c_char_p)]


STALE_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.POINTER(StaleReport), ctypes.c_void_p)
_PROTOS["xseg_check_stale"] = (_S, [ctypes.c_int, c_size_p])
_PROTOS["xseg_stale_flush"] = (_S, [ctypes.c_int])
_PROTOS["xseg_attach_stale_observer"] = (_S, [STALE_OBSERVER, ctypes.c_void_p])

# --- sleep and wake (include/xseg.h: xseg_sleep) ---------------------------------------------

SLEEP_OFFLOAD, SLEEP_DISCARD, SLEEP_OFFLOAD_FILE = 1, 2, 4


TAG_MAX = 32  # XSEG_TAG_MAX: a tag's bytes with its NUL


class TagSleep(ctypes.Structure):  # xseg_tag_sleep
    _fields_ = [("tag", ctypes.c_char_p), ("flags", ctypes.c_uint)]


class SleepStats(ctypes.Structure):
    _fields_ = [("asleep", ctypes.c_int), ("flags", ctypes.c_uint), ("released_bytes", ctypes.c_size_t),
                ("offloaded_bytes", ctypes.c_size_t), ("discarded_bytes", ctypes.c_size_t),
                ("num_sleeps", ctypes.c_int64), ("num_wakes", ctypes.c_int64)]


_PROTOS.update({
    "xseg_sleep": (_S, [ctypes.c_int, PoolId, ctypes.c_uint]),
    "xseg_sleep_ex": (_S, [ctypes.c_int, PoolId, ctypes.c_uint, ctypes.c_char_p]),
    "xseg_wake": (_S, [ctypes.c_int, PoolId]),
    "xseg_get_sleep_stats": (_S, [ctypes.c_int, ctypes.POINTER(PoolId), ctypes.POINTER(SleepStats)]),
    "xseg_pool_set_tag": (_S, [ctypes.c_int, PoolId, ctypes.c_char_p]),
    "xseg_pool_get_tag": (_S, [ctypes.c_int, PoolId, ctypes.c_char_p, ctypes.c_size_t]),
    "xseg_sleep_tags": (_S, [ctypes.c_int, ctypes.POINTER(TagSleep), ctypes.c_size_t]),
    "xseg_wake_tags": (_S, [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]),
})

# --- pinned host memory (include/xseg.h: xseg_host_malloc) ------------------------------------

_PROTOS.update({
    "xseg_host_malloc": (_S, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
    "xseg_host_free": (_S, [ctypes.c_void_p]),
    "xseg_host_record_stream": (_S, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
    "xseg_host_empty_cache": (_S, []),
    "xseg_host_stat": (_S, [ctypes.c_char_p, c_int64_p]),
    "xseg_host_stat_key": (_S, [ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p)]),
    "xseg_host_reset_peak_stats": (_S, []),
    "xseg_host_reset_accumulated_stats": (_S, []),
})

_PROTOS.update({
    "xseg_record_memory_history": (_S, [ctypes.POINTER(HistoryOptions)]),
    "xseg_dump_snapshot": (_S, [ctypes.c_int, ctypes.c_char_p]),
    "xseg_dump_snapshot_json": (_S, [ctypes.c_int, ctypes.c_char_p]),
    "xseg_set_oom_snapshot": (_S, [ctypes.c_char_p]),
    "xseg_dump_trace": (_S, [ctypes.c_int, ctypes.c_char_p]),
})


def need(name):
    """The C function `name`, or XsegError naming it when this libxseg predates it."""
    fn = getattr(lib(), name, None)
    if fn is None:
        raise XsegError(6, "%s is not in the loaded libxseg (%s): it is older than this package"
                        % (name, _path))
    return fn
