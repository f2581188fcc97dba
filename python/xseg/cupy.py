"""xseg as CuPy's device allocator (no torch needed):

    import xseg.cupy
    xseg.cupy.enable()

Allocations go to xseg on CuPy's current device and stream; memory returns to xseg when CuPy
drops its last reference.
"""
from . import _lib, free, malloc

__all__ = ["enable", "allocator"]


class _Owner:
    """Frees the xseg block when CuPy's memory object lets go of it."""
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        if self.ptr:
            try:
                free(self.ptr)
            except Exception:
                pass
            self.ptr = 0


def allocator(size):
    """A cupy.cuda allocator function: size -> cupy.cuda.MemoryPointer."""
    import cupy
    dev = cupy.cuda.Device().id
    stream = cupy.cuda.get_current_stream().ptr
    ptr = malloc(size, dev, stream)
    owner = _Owner(ptr)
    mem = cupy.cuda.UnownedMemory(ptr, size, owner, dev)
    return cupy.cuda.MemoryPointer(mem, 0)


def enable():
    """Make xseg CuPy's device allocator (cupy.cuda.set_allocator)."""
    import cupy
    _lib.lib()
    cupy.cuda.set_allocator(allocator)
