"""The Python package's tests run on cudaemu through a real libxseg: meson sets XSEG_LIBRARY,
XSEG_LIBCUDA and PYTHONPATH (tests/python/meson.build)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


@pytest.fixture
def xseg():
    import xseg as x
    yield x
    x.set_per_process_memory_fraction(1.0, 0)
    x.empty_cache()
