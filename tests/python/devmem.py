"""Device memory as the tests read and write it: through the driver xseg loaded (cudaemu here,
XSEG_LIBCUDA), never through xseg, so a test checks what the allocator left in memory."""
import ctypes
import os


def driver():
    lib = ctypes.CDLL(os.environ.get("XSEG_LIBCUDA") or "libcuda.so.1")
    for name in ("cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2"):
        getattr(lib, name).restype = ctypes.c_int
    lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    return lib


def write(ptr, data):
    assert driver().cuMemcpyHtoD_v2(ptr, data, len(data)) == 0


def read(ptr, n):
    buf = ctypes.create_string_buffer(n)
    assert driver().cuMemcpyDtoH_v2(buf, ptr, n) == 0
    return buf.raw
