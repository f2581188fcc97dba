"""Registrations from Python (xseg.register_range, xseg.range_dmabuf; docs/registrations.md)."""
import pytest

MiB = 1 << 20


def test_release_and_register_again(xseg):
    calls = []
    p = xseg.malloc(40 * MiB)
    reg = xseg.register_range(p, 40 * MiB, before=lambda ptr, n, why: calls.append(("before", ptr, n, why)),
                              after=lambda ptr, n, why: calls.append(("after", ptr, n, why)))
    try:
        xseg.sleep(xseg.DEFAULT_POOL)
        xseg.wake(xseg.DEFAULT_POOL)
        assert calls == [("before", p, 40 * MiB, "sleep"), ("after", p, 40 * MiB, "remapped")]
        assert xseg.registration_stats(0)["active"] == 1
    finally:
        reg.unregister()
        xseg.free(p)
    assert xseg.registration_stats(0)["active"] == 0


def test_callback_that_raises_keeps_the_pages(xseg):
    def boom(ptr, n, why):
        raise RuntimeError("the NIC is busy")
    p = xseg.malloc(40 * MiB)
    reg = xseg.register_range(p, 40 * MiB, before=boom)
    xseg.free(p)
    try:
        with pytest.raises(xseg.XsegError) as ei:
            xseg.empty_cache()
        assert ei.value.status_name == "XSEG_ERROR_ILLEGAL_STATE"
        assert "stay mapped" in str(ei.value)
        assert xseg.memory_reserved(0) >= 40 * MiB
    finally:
        reg.unregister()
    xseg.empty_cache()
    assert xseg.memory_reserved(0) == 0


def test_arguments(xseg):
    with pytest.raises(ValueError):
        xseg.register_range(-1, 1)
    with pytest.raises(TypeError):
        xseg.range_dmabuf(1.5, 1)
    with pytest.raises(xseg.XsegError) as ei:
        xseg.register_range(4096, 4096)
    assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE"
    p = xseg.malloc(20 * MiB)
    try:
        try:
            fd, off = xseg.range_dmabuf(p, 20 * MiB)
        except xseg.XsegError as e:  # cudaemu's default device exports no dma-buf
            assert e.status_name == "XSEG_ERROR_NOT_SUPPORTED" and "xseg_block_handles" in str(e)
        else:
            import os
            assert off == 0 and os.fstat(fd).st_size == 20 * MiB
            os.close(fd)
    finally:
        xseg.free(p)


def test_registration_safe(xseg):
    safe, why = xseg.registration_safe()
    assert safe and why.startswith("safe: ")
    xseg.set_config("expandable_segments:True,spill_to_host:True")
    try:
        safe, why = xseg.registration_safe()
        assert not safe
        assert "spill_to_host:True" in why and "expandable_segments_defrag" not in why
    finally:
        xseg.set_config("spill_to_host:False")
    assert xseg.registration_safe()[0]


def test_nccl_register_refusals(xseg, monkeypatch):
    """xseg.nccl_register never loads NCCL and never calls it with a bad argument: a library that is
    not loaded, a NULL comm or an unknown handle raise, and nothing enters the ledger."""
    monkeypatch.setenv("XSEG_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    p = xseg.malloc(4 * MiB)
    try:
        with pytest.raises(xseg.XsegError) as ei:
            xseg.nccl_register(0x1000, p, 4 * MiB)
        assert ei.value.status_name == "XSEG_ERROR_NOT_SUPPORTED" and "is not loaded" in str(ei.value)
        with pytest.raises(xseg.XsegError) as ei:
            xseg.nccl_register(0, p, 4 * MiB)
        assert ei.value.status_name == "XSEG_ERROR_INVALID_VALUE" and "comm is NULL" in str(ei.value)
        with pytest.raises(xseg.XsegError) as ei:
            xseg.nccl_register_pool(0, xseg.DEFAULT_POOL, 0)
        assert "comm is NULL" in str(ei.value)
        with pytest.raises(xseg.XsegError) as ei:
            xseg.nccl_deregister(0x1000, 0)
        assert "handle is NULL" in str(ei.value)
        assert xseg.registration_stats(0)["active"] == 0
    finally:
        xseg.free(p)
