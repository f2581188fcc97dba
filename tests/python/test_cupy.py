"""xseg.cupy.enable() under CuPy: runs only where CuPy and a GPU are present."""
import os
import sys

import pytest


def cupy_reason():
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver or no device
        return "no CUDA device for CuPy: %s" % e
    return None


@pytest.mark.skipif(cupy_reason() is not None, reason=str(cupy_reason()))
def test_cupy_arrays_come_from_xseg(xseg):
    import cupy
    import xseg.cupy
    xseg.cupy.enable()
    before = xseg.memory_allocated(0)
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    assert xseg.memory_allocated(0) >= before + 4 * (1 << 20)
    assert float(a.sum()) == float(sum(range(1 << 20)))
    del a
    import gc
    gc.collect()
    assert xseg.memory_allocated(0) == before
