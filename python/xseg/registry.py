"""Registrations that stay valid (include/xseg.h, docs/registrations.md).

    reg = xseg.register_range(ptr, size, before=drop, after=again)   # drop(ptr, size, reason)
    fd, offset = xseg.range_dmabuf(ptr, size)                        # one dma-buf for the range
    ...
    reg.unregister()

    comm = xseg.nccl_comm(group)                  # ProcessGroupNCCL's ncclComm_t
    h = xseg.nccl_register(comm, ptr, size)       # ncclCommRegister, the range in xseg's ledger
    ...
    xseg.nccl_deregister(comm, h)

`before` is called before xseg unmaps or re-backs a page of the range (xseg.empty_cache, xseg.trim,
xseg.sleep, xseg.shutdown): drop your registration and return (None or True); return False or
raise to keep the pages mapped (the xseg call then raises, naming the range). `after` is called
once every page is mapped again (xseg.wake, or an allocation that maps them): register again.
Neither runs under an xseg lock; both may call xseg.
"""
import ctypes

from . import _lib
from ._lib import C_PTR, C_SIZE, check, int_arg

__all__ = ["register_range", "Registration", "range_dmabuf", "registration_stats", "registration_safe",
           "nccl_comm", "nccl_register", "nccl_register_pool", "nccl_deregister"]

REASONS = {1: "reclaim", 2: "sleep", 3: "shutdown", 4: "move", 5: "remapped", 6: "kept"}


class _Event(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t),
                ("reason", ctypes.c_int)]


_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Event), ctypes.c_void_p)


class _Callbacks(ctypes.Structure):
    _fields_ = [("before", _CB), ("after", _CB), ("timeout_ms", ctypes.c_uint)]


class _Stats(ctypes.Structure):
    _fields_ = [("active", ctypes.c_size_t), ("released", ctypes.c_size_t),
                ("kept_bytes", ctypes.c_size_t), ("failures", ctypes.c_size_t)]


_lib._PROTOS.update({
    "xseg_register_range": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_Callbacks),
                                           ctypes.c_void_p]),
    "xseg_unregister_range": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
    "xseg_range_dmabuf": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int),
                                         ctypes.POINTER(ctypes.c_size_t)]),
    "xseg_registration_stats_get": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_Stats)]),
    "xseg_registration_safe": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t,
                                              ctypes.POINTER(ctypes.c_size_t)]),
    "xseg_nccl_register": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_void_p)]),
    "xseg_nccl_register_pool": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, _lib.PoolId,
                                               ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]),
    "xseg_nccl_deregister": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
})
if _lib._lib is not None:  # loaded before this module: declare the new prototypes now
    _lib._declare(_lib._lib)

_live = {}  # id -> Registration: keeps the C callbacks alive while registered
# Callbacks of unregistered ranges with a timeout: a timed-out callback may still run on its own
# thread after unregister(), so its ctypes trampoline must outlive the registration.
_retired = []
_next_id = [1]


def _wrap(fn):
    def call(ev, ctx):
        e = ev.contents
        try:
            ok = fn(e.ptr or 0, e.size, REASONS.get(e.reason, str(e.reason)))
        except Exception:  # a failing callback keeps the pages mapped; xseg reports it
            return 1
        return 1 if ok is False else 0
    return _CB(call) if fn is not None else _CB()


class Registration:
    """One registered range; unregister() forgets it (no callback runs)."""

    def __init__(self, ptr, size, before, after, timeout_ms):
        self.ptr, self.size = ptr, size
        self._id = _next_id[0]
        _next_id[0] += 1
        self._cbs = _Callbacks(_wrap(before), _wrap(after), timeout_ms)

    def unregister(self):
        if _live.pop(self._id, None) is None:
            return
        if self._cbs.timeout_ms:
            _retired.append(self._cbs)
        check(_lib.need("xseg_unregister_range")(self.ptr, self.size, self._id))


def register_range(ptr, size, before=None, after=None, timeout_ms=0):
    """Register [ptr, ptr + size) (mapped xseg memory inside one expandable segment). `before` and
    `after` are called as fn(ptr, size, reason); `timeout_ms` > 0 runs each on a thread of its own
    and gives up waiting after that long (the pages then stay mapped)."""
    f = "xseg.register_range"
    ptr, size = int_arg(f, "ptr", ptr, C_PTR), int_arg(f, "size", size, C_SIZE)
    timeout_ms = int_arg(f, "timeout_ms", timeout_ms, (0, 1 << 32))
    r = Registration(ptr, size, before, after, timeout_ms)
    _live[r._id] = r
    try:
        check(_lib.need("xseg_register_range")(ptr, size, ctypes.byref(r._cbs), r._id))
    except BaseException:
        del _live[r._id]
        raise
    return r


def range_dmabuf(ptr, size):
    """(fd, offset): one dma-buf file descriptor for [ptr, ptr + size) however many physical
    chunks it spans (close it yourself), and where ptr sits in it. XsegError (NOT_SUPPORTED) where
    the driver exports none: register each chunk of xseg.block_handles(ptr) instead."""
    f = "xseg.range_dmabuf"
    ptr, size = int_arg(f, "ptr", ptr, C_PTR), int_arg(f, "size", size, C_SIZE)
    fd, off = ctypes.c_int(-1), ctypes.c_size_t()
    check(_lib.need("xseg_range_dmabuf")(ptr, size, ctypes.byref(fd), ctypes.byref(off)))
    return fd.value, off.value


def registration_stats(device=0):
    """{'active', 'released', 'kept_bytes', 'failures'} of the registrations of `device`."""
    st = _Stats()
    check(_lib.need("xseg_registration_stats_get")(int_arg("xseg.registration_stats", "device", device,
                                                           (0, 1 << 31)), ctypes.byref(st)))
    return {k: getattr(st, k) for k, _ in _Stats._fields_}


def registration_safe():
    """(safe, reason): whether memory registered now outside xseg's ledger (a NIC's registration
    through NIXL or UCX, NCCL's ncclCommRegister) keeps its physical pages under the configuration
    in force, and why; the reason names the keys that make it unsafe (expandable_segments_defrag,
    spill_to_host). Ranges registered with xseg.register_range are asked first either way."""
    fn = _lib.need("xseg_registration_safe")
    safe, n = ctypes.c_int(), ctypes.c_size_t()
    check(fn(ctypes.byref(safe), None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 1)
    check(fn(ctypes.byref(safe), buf, len(buf), ctypes.byref(n)))
    return bool(safe.value), buf.value.decode()


# ---- NCCL's user-buffer registration through the ledger (xseg_nccl_register) ----------------------

def nccl_comm(group=None, device=None):
    """The ncclComm_t (an int) of a torch.distributed NCCL process group (the default group when
    None), for nccl_register: its CUDA backend's _comm_ptr() (ProcessGroupNCCL::getCommPtr, in
    recent PyTorch releases). The communicator exists once the group ran a collective on the device
    or was made with device_id=...; 0 from PyTorch raises ValueError. Raises RuntimeError on a
    PyTorch whose backend has no _comm_ptr."""
    import torch
    import torch.distributed as dist
    if group is None:
        group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    backend = group._get_backend(dev)
    get = getattr(backend, "_comm_ptr", None)
    if get is None:
        raise RuntimeError("xseg.nccl_comm: %s (PyTorch %s) has no _comm_ptr()" % (type(backend).__name__,
                                                                                  torch.__version__))
    comm = int(get())
    if not comm:
        raise ValueError("xseg.nccl_comm: the group has no NCCL communicator on %s yet (run a collective there, or "
                         "init_process_group(..., device_id=...))" % dev)
    return comm


def nccl_register(comm, ptr, size):
    """ncclCommRegister(comm, ptr, size) through xseg: the range (mapped xseg memory of one
    expandable segment) stays put (no sleep, reclaim, spill or defrag takes its pages) until
    nccl_deregister. Returns xseg's handle (an int). XsegError NOT_SUPPORTED when no NCCL is
    loaded (XSEG_NCCL_LIBRARY names one), DRIVER when NCCL refuses; nothing is left registered then."""
    f = "xseg.nccl_register"
    comm, ptr = int_arg(f, "comm", comm, C_PTR), int_arg(f, "ptr", ptr, C_PTR)
    size = int_arg(f, "size", size, C_SIZE)
    h = ctypes.c_void_p()
    check(_lib.need("xseg_nccl_register")(comm, ptr, size, ctypes.byref(h)))
    return h.value


def nccl_register_pool(comm, pool=(0, 0), device=None):
    """PyTorch's register_mem_pool through xseg: every segment `pool` (DEFAULT_POOL, a pair, or a
    torch.cuda.MemPool) has mapped on `device` now, under one handle: (handle, count); handle is
    None when the pool maps nothing there. Segments the pool grows later are not registered."""
    from . import _device, _pool
    f = "xseg.nccl_register_pool"
    comm = int_arg(f, "comm", comm, C_PTR)
    h, n = ctypes.c_void_p(), ctypes.c_size_t()
    check(_lib.need("xseg_nccl_register_pool")(comm, _device(device, f), _pool(pool, f), ctypes.byref(h),
                                               ctypes.byref(n)))
    return h.value, n.value


def nccl_deregister(comm, handle):
    """ncclCommDeregister of what nccl_register or nccl_register_pool registered under `handle`;
    then the pages are xseg's again. XsegError INVALID_VALUE for an unknown handle (or one
    deregistered already), DRIVER when NCCL refuses (that range stays registered: call again)."""
    f = "xseg.nccl_deregister"
    comm, handle = int_arg(f, "comm", comm, C_PTR), int_arg(f, "handle", handle, C_PTR)
    check(_lib.need("xseg_nccl_deregister")(comm, handle))
