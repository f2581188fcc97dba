"""Giving cached memory back from Python: trim."""
import pytest

MiB = 1 << 20


def cached(x):
    return x.memory_reserved(0) - x.memory_allocated(0)


def test_trim_keeps_at_most_what_is_asked(xseg):
    ps = [xseg.malloc(20 * MiB) for _ in range(6)]
    keep = ps[1]
    for p in ps:
        if p != keep:
            xseg.free(p)
    try:
        assert cached(xseg) >= 80 * MiB
        xseg.trim(40 * MiB, 0)
        assert cached(xseg) <= 40 * MiB
        assert xseg.memory_allocated(0) >= 20 * MiB  # the live block stays
        xseg.trim()
        assert cached(xseg) < 20 * MiB
    finally:
        xseg.free(keep)


def test_trim_arguments(xseg):
    with pytest.raises(ValueError):
        xseg.trim(-1)
    with pytest.raises(ValueError):
        xseg.trim(1.5)
    with pytest.raises(xseg.XsegError) as ei:
        xseg.trim(0, 99)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_DEVICE"
