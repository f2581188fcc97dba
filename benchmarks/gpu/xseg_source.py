"""The xseg package of this source tree (python/xseg) for the GPU benchmarks, over the libxseg
their --lib names, with its PyTorch adapter (xseg.torch)."""
import os
import sys


def import_xseg(lib):
    os.environ["XSEG_LIBRARY"] = os.path.abspath(lib)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
    if os.path.isdir(os.path.join(src, "xseg")):
        sys.path.insert(0, os.path.abspath(src))
    import xseg
    import xseg.torch
    return xseg


def import_xseg_core(lib):
    """The package without its PyTorch adapter (no torch needed)."""
    os.environ["XSEG_LIBRARY"] = os.path.abspath(lib)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
    if os.path.isdir(os.path.join(src, "xseg")):
        sys.path.insert(0, os.path.abspath(src))
    import xseg
    return xseg
