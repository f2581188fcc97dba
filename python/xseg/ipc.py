"""Sharing xseg memory between processes (include/xseg.h, "IPC of expandable memory").

    h = xseg.ipc_export(ptr)          # in the exporting process
    h.send(sock)                      # over a connected AF_UNIX socket (descriptors as SCM_RIGHTS)
    h = xseg.IpcHandle.recv(sock)     # in the importing process
    p = xseg.ipc_import(h, device=0)  # a mapping sized to the block, at a new address
    ...
    xseg.ipc_close(p); h.free()

Fabric handles also travel as bytes: h.serialize() / xseg.IpcHandle.deserialize(data).
A socket object's timeout (sock.settimeout) bounds each receive and send of recv() and send().
The lifetime rules are the C API's: keep the block allocated in the exporter until every
importer has closed it.
"""
import contextlib
import ctypes
import socket
import struct

from . import _lib
from ._lib import C_INT, C_PTR, check, int_arg

__all__ = ["IpcHandle", "ipc_export", "ipc_import", "ipc_close", "block_handles",
           "block_handles_release"]

_TYPES = {1: "posix_fd", 2: "fabric"}


class _Info(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("size", ctypes.c_size_t),
                ("offset", ctypes.c_size_t), ("nchunks", ctypes.c_size_t),
                ("span", ctypes.c_size_t)]


class _PhysRange(ctypes.Structure):
    _fields_ = [("address", ctypes.c_uint64), ("length", ctypes.c_size_t),
                ("handle", ctypes.c_uint64), ("offset", ctypes.c_size_t)]


_H = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_lib._PROTOS.update({
    "xseg_ipc_export": (ctypes.c_int, [ctypes.c_void_p, _PP]),
    "xseg_ipc_handle_info": (ctypes.c_int, [_H, ctypes.POINTER(_Info)]),
    "xseg_ipc_send": (ctypes.c_int, [ctypes.c_int, _H]),
    "xseg_ipc_recv": (ctypes.c_int, [ctypes.c_int, _PP]),
    "xseg_ipc_serialize": (ctypes.c_int, [_H, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_size_t)]),
    "xseg_ipc_deserialize": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, _PP]),
    "xseg_ipc_import": (ctypes.c_int, [_H, ctypes.c_int, _PP]),
    "xseg_ipc_close": (ctypes.c_int, [ctypes.c_void_p]),
    "xseg_ipc_handle_free": (None, [_H]),
    "xseg_block_handles": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_PhysRange),
                                          ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "xseg_block_handles_release": (ctypes.c_int, [ctypes.c_void_p]),
})
if _lib._lib is not None:  # loaded before this module: declare the new prototypes now
    _lib._declare(_lib._lib)


def _fd(sock, func):
    """A socket's descriptor for C: a socket object (its fileno()) or a descriptor."""
    if not isinstance(sock, int) and hasattr(sock, "fileno"):
        sock = sock.fileno()
    return int_arg(func, "sock", sock, C_INT, 0)


@contextlib.contextmanager
def _timeout_as_sockopt(sock, opt):
    """A socket object with a timeout (settimeout) is non-blocking underneath, where the C calls
    would fail at once instead of waiting: for the call, make it blocking with the timeout as
    SO_RCVTIMEO / SO_SNDTIMEO (@p opt), which bounds each receive or send, then restore it."""
    t = sock.gettimeout() if isinstance(sock, socket.socket) else None
    if not t:  # a descriptor, no timeout (blocking), or 0 (non-blocking, as its owner chose)
        yield
        return
    tv = struct.Struct("@ll")
    old = sock.getsockopt(socket.SOL_SOCKET, opt, tv.size)
    sec = int(t)
    usec = max(int((t - sec) * 1e6), 0 if sec else 1)  # 0:0 would mean no limit
    sock.setblocking(True)
    try:
        sock.setsockopt(socket.SOL_SOCKET, opt, tv.pack(sec, usec))
        yield
    finally:
        sock.setsockopt(socket.SOL_SOCKET, opt, old)
        sock.settimeout(t)


def _handle(handle, func):
    if not isinstance(handle, IpcHandle):
        raise TypeError("%s: handle must be an xseg.IpcHandle, not %s" % (func, type(handle).__name__))
    return handle._ptr


class IpcHandle:
    """An exported block: the shareable handles of its pages, its offset and size. Owns the
    C handle (and, for POSIX handles, its file descriptors) until free()."""

    def __init__(self, raw):
        self._raw = raw

    @property
    def _ptr(self):
        if not self._raw:
            raise ValueError("the IPC handle was freed")
        return self._raw

    def info(self):
        """{'type': 'posix_fd'|'fabric', 'device', 'size', 'offset', 'nchunks', 'span'}"""
        i = _Info()
        check(_lib.need("xseg_ipc_handle_info")(self._ptr, ctypes.byref(i)))
        return {"type": _TYPES.get(i.type, i.type), "device": i.device, "size": i.size,
                "offset": i.offset, "nchunks": i.nchunks, "span": i.span}

    def send(self, sock):
        """Send over a connected AF_UNIX socket (a socket object or a descriptor). A socket
        object's timeout bounds each send (then XsegError)."""
        fd = _fd(sock, "xseg.IpcHandle.send")
        with _timeout_as_sockopt(sock, socket.SO_SNDTIMEO):
            check(_lib.need("xseg_ipc_send")(fd, self._ptr))

    @classmethod
    def recv(cls, sock):
        """Receive a handle sent with send(). Waits as long as the socket does: a socket
        object's timeout bounds each receive (then XsegError); a descriptor waits until its
        SO_RCVTIMEO, if any."""
        fd = _fd(sock, "xseg.IpcHandle.recv")
        raw = ctypes.c_void_p()
        with _timeout_as_sockopt(sock, socket.SO_RCVTIMEO):
            check(_lib.need("xseg_ipc_recv")(fd, ctypes.byref(raw)))
        return cls(raw.value)

    def serialize(self):
        """The flat bytes of a fabric handle (POSIX handles raise: use send())."""
        fn = _lib.need("xseg_ipc_serialize")
        n = ctypes.c_size_t()
        check(fn(self._ptr, None, 0, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(n.value)
        check(fn(self._ptr, buf, n.value, ctypes.byref(n)))
        return buf.raw[:n.value]

    @classmethod
    def deserialize(cls, data):
        try:  # bytes-like only: bytes(n) would make n zero bytes of an int
            data = memoryview(data).tobytes()
        except TypeError:
            raise TypeError("xseg.IpcHandle.deserialize: data must be bytes-like, not %s"
                            % type(data).__name__) from None
        raw = ctypes.c_void_p()
        check(_lib.need("xseg_ipc_deserialize")(data, len(data), ctypes.byref(raw)))
        return cls(raw.value)

    def free(self):
        """Close the handle's descriptors and free it (idempotent)."""
        if self._raw:
            _lib.need("xseg_ipc_handle_free")(self._raw)
            self._raw = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


def ipc_export(ptr):
    """Export the live block at `ptr` (an address xseg.malloc or a torch tensor's data_ptr())."""
    ptr = int_arg("xseg.ipc_export", "ptr", ptr, C_PTR)
    raw = ctypes.c_void_p()
    check(_lib.need("xseg_ipc_export")(ptr, ctypes.byref(raw)))
    return IpcHandle(raw.value)


def ipc_import(handle, device=0):
    """Map an imported block on `device`; returns its address. Close it with ipc_close()."""
    f = "xseg.ipc_import"
    dev, h = int_arg(f, "device", device, C_INT, 0), _handle(handle, f)
    p = ctypes.c_void_p()
    check(_lib.need("xseg_ipc_import")(h, dev, ctypes.byref(p)))
    return p.value


def ipc_close(ptr):
    """Unmap an address ipc_import returned."""
    check(_lib.need("xseg_ipc_close")(int_arg("xseg.ipc_close", "ptr", ptr, C_PTR)))


def block_handles(ptr):
    """The physical pieces under the live block at `ptr`, for NCCL/RDMA registration: a list of
    {'address', 'length', 'handle' (CUmemGenericAllocationHandle, 0 for classic memory),
    'offset'} in address order. Each call holds the block: its pool refuses xseg.sleep until
    block_handles_release(ptr) (once per call) or the block is freed."""
    ptr = int_arg("xseg.block_handles", "ptr", ptr, C_PTR)
    fn = _lib.need("xseg_block_handles")
    n = ctypes.c_size_t()
    check(fn(ptr, None, 0, ctypes.byref(n)))
    arr = (_PhysRange * max(n.value, 1))()
    check(fn(ptr, arr, n.value, ctypes.byref(n)))
    return [{"address": r.address, "length": r.length, "handle": r.handle, "offset": r.offset}
            for r in arr[:n.value]]


def block_handles_release(ptr):
    """Drop the hold one block_handles(ptr) call took, once its handles are no longer used."""
    check(_lib.need("xseg_block_handles_release")(
        int_arg("xseg.block_handles_release", "ptr", ptr, C_PTR)))
