"""IPC through the package: a second process receives a block over a Unix socket, maps it and
reads what the first wrote (copies through the driver that XSEG_LIBCUDA names)."""
import ctypes
import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

MiB = 1 << 20
PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


def driver():
    cu = ctypes.CDLL(os.environ.get("XSEG_LIBCUDA", "libcuda.so.1"))
    cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    return cu


CHILD = """
import ctypes, os, socket, sys
sys.path.insert(0, %r)
import xseg
sock = socket.socket(fileno=int(sys.argv[1]))
h = xseg.IpcHandle.recv(sock)
info = h.info()
p = xseg.ipc_import(h, 0)
cu = ctypes.CDLL(os.environ.get("XSEG_LIBCUDA", "libcuda.so.1"))
cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
buf = ctypes.create_string_buffer(info["size"])
assert cu.cuMemcpyDtoH_v2(buf, p, info["size"]) == 0
xseg.ipc_close(p)
h.free()
print(info["type"], info["size"], buf.raw[:8].hex(), buf.raw[-8:].hex())
sock.sendall(b"done")
"""


def test_export_send_import_in_another_process(xseg):
    size = 3 * MiB
    p = xseg.malloc(size)
    try:
        data = bytes(range(256)) * (size // 256)
        assert driver().cuMemcpyHtoD_v2(p, data, size) == 0
        h = xseg.ipc_export(p)
        info = h.info()
        assert info["size"] >= size and info["device"] == 0 and info["nchunks"] >= 1 and info["span"] >= size
        a, b = socket.socketpair()
        child = subprocess.Popen([sys.executable, "-c", CHILD % PKG, str(b.fileno())],
                                 pass_fds=[b.fileno()], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        b.close()
        h.send(a)
        assert a.recv(4) == b"done"
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        kind, got_size, head, tail = out.split()
        assert kind in ("posix_fd", "fabric") and int(got_size) == info["size"]
        assert head == data[:8].hex()
        # the block's last bytes: the child read info["size"] >= size bytes from the block start
        h.free()
        h.free()  # idempotent
        with pytest.raises(ValueError):
            h.info()
    finally:
        xseg.free(p)


def test_socket_timeout_bounds_recv(xseg):
    """A socket object's timeout: recv waits for a slow peer (it did not: the socket is
    non-blocking underneath) and gives up on a silent one with an error, the timeout kept."""
    p = xseg.malloc(2 * MiB)
    try:
        with xseg.ipc_export(p) as h:
            a, b = socket.socketpair()
            with a, b:
                b.settimeout(0.5)
                with pytest.raises(xseg.XsegError):
                    xseg.IpcHandle.recv(b)  # nothing sent: an error, not a hang
                assert b.gettimeout() == 0.5
                b.settimeout(60)
                a.settimeout(60)
                later = threading.Timer(0.3, h.send, args=(a,))
                later.start()
                try:
                    got = xseg.IpcHandle.recv(b)
                finally:
                    later.join()
                assert got.info()["size"] == h.info()["size"]
                assert b.gettimeout() == 60
                got.free()
    finally:
        xseg.free(p)


def test_import_in_same_process_and_block_handles(xseg):
    p = xseg.malloc(5 * MiB)
    try:
        ranges = xseg.block_handles(p)
        assert ranges and ranges[0]["address"] == p
        assert sum(r["length"] for r in ranges) >= 5 * MiB
        assert all(r["handle"] != 0 for r in ranges)  # expandable pages have handles
        with xseg.ipc_export(p) as h:
            q = xseg.ipc_import(h, 0)
            assert q != p
            msg = b"xseg-ipc"
            cu = driver()
            assert cu.cuMemcpyHtoD_v2(p, msg, len(msg)) == 0
            back = ctypes.create_string_buffer(len(msg))
            assert cu.cuMemcpyDtoH_v2(back, q, len(msg)) == 0
            assert back.raw == msg
            xseg.ipc_close(q)
            with pytest.raises(xseg.XsegError):
                xseg.ipc_close(q)
            if h.info()["type"] == "posix_fd":
                with pytest.raises(xseg.XsegError) as ei:
                    h.serialize()
                assert ei.value.status_name == "XSEG_ERROR_NOT_SUPPORTED"
    finally:
        xseg.free(p)


def test_block_handles_hold_sleep(xseg):
    """Handed-out handles keep the block's pool awake until each hand-out is released."""
    p = xseg.malloc(5 * MiB)
    try:
        xseg.block_handles(p)
        xseg.block_handles(p)
        for _ in range(2):
            with pytest.raises(xseg.XsegError) as ei:
                xseg.sleep()
            assert ei.value.status_name == "XSEG_ERROR_ILLEGAL_STATE"
            assert "xseg_block_handles_release(0x%x)" % p in str(ei.value)
            xseg.block_handles_release(p)
        xseg.sleep()
        xseg.wake()
        with pytest.raises(xseg.XsegError) as ei:
            xseg.block_handles_release(p)  # released as often as handed out
        assert ei.value.status_name == "XSEG_ERROR_ILLEGAL_STATE"
        xseg.block_handles(p)
    finally:
        xseg.free(p)  # ends the hold
    xseg.sleep()
    xseg.wake()
    with pytest.raises(xseg.XsegError) as ei:
        xseg.block_handles_release(p)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"


def test_ipc_errors(xseg):
    with pytest.raises(xseg.XsegError) as ei:
        xseg.ipc_export(0x1000)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"
    with pytest.raises(xseg.XsegError):
        xseg.IpcHandle.deserialize(b"not a handle")
    with pytest.raises(xseg.XsegError):
        xseg.block_handles(0x1000)
