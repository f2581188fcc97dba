#!/usr/bin/env python3
"""Driver facts and one driver cost that bench_vmm_costs does not measure, straight through
ctypes (standard library) on libcuda.so.1, or on the library $XSEG_LIBCUDA names (cudaemu).

  device_probe.py info                  devices, names, VMM and fabric support (with what cuMemCreate
                                        answers for a fabric-exportable page), the peer matrix
  device_probe.py remap [--reps N] [--sizes MiB,...]
        the remap of a kept handle: one cuMemCreate, then N times map + set access + unmap of the
        same handle at the same address (what a segment does when it maps a page it kept), in
        microseconds per call (median, p10, p90)
  device_probe.py probes [--emulator] [--ptx-dir DIR]
        what other issues need to know of the driver, one JSON line each {"name", "status",
        "reason", "data"} (benchmarks/gpu/check_probes.sh): host-located VMM memory read and
        written by a kernel, one physical handle mapped at many addresses, a dma-buf fd from
        cuMemGetHandleForAddressRange, one over several chunks and the RDMA flag of cuMemCreate
        with what cuPointerGetAttribute(IS_GPU_DIRECT_RDMA_CAPABLE) answers for such a chunk
        (xseg_range_dmabuf, gpu_direct_rdma, expandable_segments_rdma). A probe passes when the driver answered (data.supported
        true or false, data.words: the driver's own words); it fails only when the answer is
        inconsistent (say, a kernel ran but the bytes are wrong); --emulator: what cudaemu cannot
        do is skipped with the reason.

info and remap print one JSON object on stdout.
"""
import ctypes
import json
import os
import statistics
import sys
import time

ATTR_VMM = 102
ATTR_FABRIC = 128
CUDA_SUCCESS = 0


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def load():
    cu = ctypes.CDLL(os.environ.get("XSEG_LIBCUDA") or "libcuda.so.1")

    def call(name, *args):
        r = getattr(cu, name)(*args)
        if r != CUDA_SUCCESS:
            raise RuntimeError("%s failed with CUresult %d" % (name, r))
    call("cuInit", 0)
    return cu, call


def fabric_create(cu, d):
    """What cuMemCreate answers for a page exportable as a fabric handle (the attribute says the GPU
    can; the allocation also needs an IMEX channel): the CUresult's name, as xseg's IPC probe sees it."""
    ctx = ctypes.c_void_p()
    if cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) != CUDA_SUCCESS or cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS:
        return "no context"
    try:
        prop = AllocationProp(type=1, requestedHandleTypes=1 | 8, location=Location(1, d.value))  # POSIX fd | FABRIC
        gran = ctypes.c_size_t()
        r = cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0)
        if r == CUDA_SUCCESS:
            h = ctypes.c_uint64()
            r = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(gran.value), ctypes.byref(prop), ctypes.c_uint64(0))
            if r == CUDA_SUCCESS:
                cu.cuMemRelease(ctypes.c_uint64(h.value))
        name = ctypes.c_char_p()
        if cu.cuGetErrorName(r, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
            return name.value.decode()
        return "CUresult %d" % r
    finally:
        cu.cuCtxSetCurrent(None)
        cu.cuDevicePrimaryCtxRelease_v2(d)


def info():
    cu, call = load()
    n, ver = ctypes.c_int(), ctypes.c_int()
    call("cuDriverGetVersion", ctypes.byref(ver))
    call("cuDeviceGetCount", ctypes.byref(n))
    devs = []
    for i in range(n.value):
        d, v = ctypes.c_int(), ctypes.c_int()
        call("cuDeviceGet", ctypes.byref(d), i)
        name = ctypes.create_string_buffer(256)
        call("cuDeviceGetName", name, 256, d)
        row = {"ordinal": i, "name": name.value.decode(errors="replace")}
        for key, attr in (("vmm", ATTR_VMM), ("fabric", ATTR_FABRIC)):
            v.value = 0
            row[key] = bool(v.value) if cu.cuDeviceGetAttribute(ctypes.byref(v), attr, d) == 0 else None
        if row["fabric"]:
            row["fabric_create"] = fabric_create(cu, d)
        row["peer"] = []
        for j in range(n.value):
            if j == i:
                continue
            e, can = ctypes.c_int(), ctypes.c_int()
            call("cuDeviceGet", ctypes.byref(e), j)
            call("cuDeviceCanAccessPeer", ctypes.byref(can), d, e)
            if can.value:
                row["peer"].append(j)
        devs.append(row)
    return {"driver_version": ver.value, "device_count": n.value, "devices": devs}


def remap(reps, sizes_mib):
    cu, call = load()
    d, ctx = ctypes.c_int(), ctypes.c_void_p()
    call("cuDeviceGet", ctypes.byref(d), 0)
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), d)
    call("cuCtxSetCurrent", ctx)
    prop = AllocationProp(type=1, requestedHandleTypes=0, location=Location(1, d.value))  # pinned, device
    gran = ctypes.c_size_t()
    call("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), 0)
    access = AccessDesc(location=Location(1, d.value), flags=3)  # read-write
    cu.cuMemMap.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64]
    cu.cuMemUnmap.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
    cu.cuMemSetAccess.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    cu.cuMemAddressFree.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
    cu.cuMemRelease.argtypes = [ctypes.c_uint64]
    rows = []
    for mib in sizes_mib:
        size = max(gran.value, (mib << 20) // gran.value * gran.value)
        h, va = ctypes.c_uint64(), ctypes.c_uint64()
        call("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_uint64(0))
        call("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
             ctypes.c_uint64(0), ctypes.c_uint64(0))
        t = {"cuMemMap": [], "cuMemSetAccess": [], "cuMemUnmap": []}
        try:
            for _ in range(reps):
                for name, args in (("cuMemMap", (va.value, size, 0, h.value, 0)),
                                   ("cuMemSetAccess", (va.value, size, ctypes.addressof(access), 1)),
                                   ("cuMemUnmap", (va.value, size))):
                    t0 = time.perf_counter_ns()
                    call(name, *args)
                    t[name].append((time.perf_counter_ns() - t0) / 1e3)
        finally:
            cu.cuMemAddressFree(va.value, size)
            cu.cuMemRelease(h.value)
        for name, xs in t.items():
            xs.sort()
            rows.append({"page_mib": size >> 20, "op": name, "reps": reps, "median_us": statistics.median(xs),
                         "p10_us": xs[len(xs) // 10], "p90_us": xs[min(len(xs) - 1, len(xs) * 9 // 10)]})
        rows.append({"page_mib": size >> 20, "op": "remap (map + set access + unmap)", "reps": reps,
                     "median_us": sum(r["median_us"] for r in rows[-3:])})
    return {"granularity": gran.value, "rows": rows}


# --- probes --------------------------------------------------------------------------------------

LOC_DEVICE, LOC_HOST, LOC_HOST_NUMA = 1, 2, 3
ATTR_CC_MAJOR, ATTR_CC_MINOR = 75, 76
ATTR_DMA_BUF = 124
ATTR_HOST_NUMA_ID = 134
ATTR_HOST_NUMA_VMM = 141
ATTR_RDMA_VMM = 110  # CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
POINTER_ATTR_RDMA_CAPABLE = 15  # CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
RANGE_HANDLE_DMA_BUF_FD = 1

# The probe kernel: p[i] += 1 for i < n (32-bit words). Hand-written PTX, loaded by the driver's
# JIT (cuModuleLoadData), so the probe needs no compiler; probe_kernel.cu is the same kernel
# for nvcc, tried when the driver refuses this text.
PTX = r"""
.version 7.0
.target sm_75
.address_size 64
.visible .entry xseg_probe_inc(.param .u64 xseg_probe_p, .param .u32 xseg_probe_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [xseg_probe_p];
    ld.param.u32 %r1, [xseg_probe_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r6, [%rd4];
    add.s32 %r7, %r6, 1;
    st.global.u32 [%rd4], %r7;
DONE:
    ret;
}
"""


class Refused(Exception):
    """A driver call failed: the call, its CUresult, and the driver's name and words for it."""

    def __init__(self, call, code, words):
        super().__init__("%s: %s" % (call, words))
        self.call, self.code, self.words = call, code, words


class Driver:
    def __init__(self):
        self.cu = ctypes.CDLL(os.environ.get("XSEG_LIBCUDA") or "libcuda.so.1")
        self.check("cuInit", 0)

    def has(self, name):
        return hasattr(self.cu, name)

    def words(self, code):
        """The driver's name and description of a CUresult: "CUDA_ERROR_X (text)"."""
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        parts = []
        if self.has("cuGetErrorName") and self.cu.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            parts.append(name.value.decode(errors="replace"))
        if self.has("cuGetErrorString") and self.cu.cuGetErrorString(code, ctypes.byref(text)) == 0 and text.value:
            parts.append("(%s)" % text.value.decode(errors="replace"))
        return " ".join(parts) or "CUresult %d" % code

    def check(self, name, *args):
        if not self.has(name):
            raise Refused(name, None, "this driver library has no %s" % name)
        r = getattr(self.cu, name)(*args)
        if r != CUDA_SUCCESS:
            raise Refused(name, r, "%s returned %s" % (name, self.words(r)))

    def attr(self, attr, dev):
        v = ctypes.c_int(0)
        r = self.cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
        return v.value if r == CUDA_SUCCESS else None


def probe_context(drv):
    d, ctx = ctypes.c_int(), ctypes.c_void_p()
    drv.check("cuDeviceGet", ctypes.byref(d), 0)
    drv.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), d)
    drv.check("cuCtxSetCurrent", ctx)
    return d.value


class Mapping:
    """cuMemCreate of SIZE at LOCATION (type, id), reserved and mapped once, read-write for the
    device; undone by close() in reverse order whatever step failed."""

    def __init__(self, drv, dev, loc_type, loc_id, min_size):
        self.drv, self.handle, self.va, self.size, self.mapped = drv, None, 0, 0, False
        cu = drv.cu
        cu.cuMemMap.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64]
        cu.cuMemUnmap.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        cu.cuMemSetAccess.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
        cu.cuMemAddressFree.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        cu.cuMemRelease.argtypes = [ctypes.c_uint64]
        prop = AllocationProp(type=1, requestedHandleTypes=0, location=Location(loc_type, loc_id))
        gran = ctypes.c_size_t()
        drv.check("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), 0)
        self.size = max(gran.value, (min_size + gran.value - 1) // gran.value * gran.value)
        h = ctypes.c_uint64()
        drv.check("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(self.size), ctypes.byref(prop), ctypes.c_uint64(0))
        self.handle = h.value
        try:
            self.va = self.reserve(self.size)
            self.map_at(self.va, dev)
            self.mapped = True
        except BaseException:
            self.close()
            raise

    def reserve(self, size):
        va = ctypes.c_uint64()
        self.drv.check("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                       ctypes.c_uint64(0), ctypes.c_uint64(0))
        return va.value

    def map_at(self, va, dev):
        self.drv.check("cuMemMap", va, self.size, 0, self.handle, 0)
        access = AccessDesc(location=Location(LOC_DEVICE, dev), flags=3)
        try:
            self.drv.check("cuMemSetAccess", va, self.size, ctypes.addressof(access), 1)
        except BaseException:
            self.drv.cu.cuMemUnmap(va, self.size)
            raise

    def close(self):
        if self.mapped:
            self.drv.cu.cuMemUnmap(self.va, self.size)
            self.mapped = False
        if self.va:
            self.drv.cu.cuMemAddressFree(self.va, self.size)
            self.va = 0
        if self.handle is not None:
            self.drv.cu.cuMemRelease(self.handle)
            self.handle = None


def copy_in(drv, va, data):
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    drv.cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    drv.check("cuMemcpyHtoD_v2", va, buf, len(data))


def copy_out(drv, va, n):
    buf = ctypes.create_string_buffer(n)
    drv.cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    drv.check("cuMemcpyDtoH_v2", buf, va, n)
    return buf.raw


def load_kernel(drv, dev, ptx_dir):
    """The probe kernel as a CUfunction, and how it was made: the PTX above through the driver's
    JIT, else probe_kernel.cu through nvcc -ptx (where nvcc is installed)."""
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    first = None
    try:
        drv.check("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(PTX.encode()))
        how = "hand-written PTX (sm_75) through the driver's JIT"
    except Refused as e:
        first = e
        import shutil
        import subprocess
        nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
        if nvcc is None or e.code is None:
            raise
        cc = "%d%d" % (drv.attr(ATTR_CC_MAJOR, dev) or 7, drv.attr(ATTR_CC_MINOR, dev) or 0)
        out = os.path.join(ptx_dir or "/tmp", "xseg_probe_kernel.ptx")
        r = subprocess.run([nvcc, "-ptx", "-arch=compute_%s" % cc, "-o", out,
                            os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_kernel.cu")],
                           capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise Refused("nvcc", None, "the JIT refused the PTX (%s) and nvcc failed: %s" % (e.words, r.stderr[-500:]))
        drv.check("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(open(out, "rb").read() + b"\0"))
        how = "probe_kernel.cu through nvcc -ptx -arch=compute_%s (the JIT refused the hand-written PTX: %s)" % (
            cc, first.words)
    drv.check("cuModuleGetFunction", ctypes.byref(fn), mod, b"xseg_probe_inc")
    return fn, how


def launch_inc(drv, fn, va, words):
    p, n = ctypes.c_uint64(va), ctypes.c_uint32(words)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(p), ctypes.c_void_p),
                                   ctypes.cast(ctypes.byref(n), ctypes.c_void_p))
    drv.cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p,
                                                                              ctypes.c_void_p, ctypes.c_void_p]
    drv.check("cuLaunchKernel", fn, (words + 255) // 256, 1, 1, 256, 1, 1, 0, None, params, None)
    drv.check("cuCtxSynchronize")


def probe_host_vmm(drv, dev, emulator, ptx_dir):
    """Host-located VMM memory (cuMemCreate at CU_MEM_LOCATION_TYPE_HOST_NUMA, then HOST),
    mapped for the device, read and written by a kernel: the bytes the host put there come back
    incremented."""
    if emulator:
        raise Skip("cudaemu runs no kernels (no cuModuleLoadData, cuLaunchKernel): the real driver answers")
    fn, how = load_kernel(drv, dev, ptx_dir)
    numa = drv.attr(ATTR_HOST_NUMA_ID, dev)
    data = {"kernel": how, "host_numa_vmm_attribute": drv.attr(ATTR_HOST_NUMA_VMM, dev), "host_numa_id": numa,
            "locations": {}}
    words = 1 << 16
    for label, loc, loc_id in (("HOST_NUMA", LOC_HOST_NUMA, max(numa or 0, 0)), ("HOST", LOC_HOST, 0)):
        m = None
        try:
            m = Mapping(drv, dev, loc, loc_id, words * 4)
            before = bytes((i * 7) & 0xFF for i in range(words * 4))
            copy_in(drv, m.va, before)
            launch_inc(drv, fn, m.va, words)
            after = copy_out(drv, m.va, words * 4)
            want = b"".join(((int.from_bytes(before[i:i + 4], "little") + 1) & 0xFFFFFFFF).to_bytes(4, "little")
                            for i in range(0, len(before), 4))
            if after != want:
                bad = next(i for i in range(len(want)) if after[i] != want[i])
                raise AssertionError("%s: the kernel ran but byte %d reads %d, not %d" % (label, bad, after[bad], want[bad]))
            data["locations"][label] = {"supported": True, "words": "cuMemCreate, cuMemMap, a kernel's read and "
                                        "write, the host's copies all succeeded", "bytes": m.size}
        except Refused as e:
            data["locations"][label] = {"supported": False, "words": str(e)}
        finally:
            if m:
                m.close()
    data["supported"] = any(v["supported"] for v in data["locations"].values())
    data["words"] = "; ".join("%s: %s" % (k, v["words"]) for k, v in data["locations"].items())
    return data


def probe_multimap(drv, dev, emulator, ptx_dir, count=256):
    """One physical handle mapped at COUNT addresses (one reservation, page after page): bytes
    written through the first mapping read back through the last; the count reached and, if
    the driver refused one, its words."""
    m = Mapping(drv, dev, LOC_DEVICE, dev, 1)
    extra_va, mapped = 0, []
    data = {"page_bytes": m.size, "asked": count}
    try:
        extra_va = m.reserve(m.size * (count - 1))
        try:
            for i in range(count - 1):
                m.map_at(extra_va + i * m.size, dev)
                mapped.append(extra_va + i * m.size)
            data["words"] = "all %d mappings succeeded" % count
        except Refused as e:
            data["words"] = "mapping %d refused: %s" % (len(mapped) + 2, e)
        data["mappings"] = len(mapped) + 1
        if mapped:
            pattern = bytes((i * 13 + 5) & 0xFF for i in range(4096))
            copy_in(drv, m.va, pattern)
            seen = copy_out(drv, mapped[-1], 4096)
            if seen != pattern:
                raise AssertionError("written at the first address, the last of %d mappings reads other bytes" %
                                     data["mappings"])
            copy_in(drv, mapped[0], pattern[::-1])
            if copy_out(drv, m.va, 4096) != pattern[::-1]:
                raise AssertionError("written at the second address, the first reads other bytes")
        data["supported"] = data["mappings"] >= 2
    finally:
        for va in mapped:
            drv.cu.cuMemUnmap(va, m.size)
        if extra_va:
            drv.cu.cuMemAddressFree(extra_va, m.size * (count - 1))
        m.close()
    return data


def probe_dmabuf(drv, dev, emulator, ptx_dir):
    """cuMemGetHandleForAddressRange(DMA_BUF_FD) on a VMM mapping and on cuMemAlloc memory: a
    file descriptor (checked with fstat, then closed), or the driver's words."""
    if not drv.has("cuMemGetHandleForAddressRange"):
        if emulator:
            raise Skip("cudaemu has no cuMemGetHandleForAddressRange: the real driver answers")
        return {"supported": False, "words": "this driver library has no cuMemGetHandleForAddressRange"}
    drv.cu.cuMemGetHandleForAddressRange.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t,
                                                     ctypes.c_int, ctypes.c_ulonglong]
    data = {"dma_buf_attribute": drv.attr(ATTR_DMA_BUF, dev), "ranges": {}}

    def export(label, va, size):
        fd = ctypes.c_int(-1)
        try:
            drv.check("cuMemGetHandleForAddressRange", ctypes.byref(fd), va, size, RANGE_HANDLE_DMA_BUF_FD, 0)
            st = os.fstat(fd.value)
            data["ranges"][label] = {"supported": True, "words": "fd %d (st_mode %o, st_size %d)" % (
                fd.value, st.st_mode, st.st_size)}
        except Refused as e:
            data["ranges"][label] = {"supported": False, "words": str(e)}
        finally:
            if fd.value >= 0:
                os.close(fd.value)

    m = Mapping(drv, dev, LOC_DEVICE, dev, 2 << 20)
    try:
        export("VMM mapping", m.va, m.size)
    finally:
        m.close()
    p = ctypes.c_uint64()
    drv.cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    drv.check("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(2 << 20))
    try:
        export("cuMemAlloc", p.value, 2 << 20)
    finally:
        drv.cu.cuMemFree_v2(p.value)
    data["supported"] = any(v["supported"] for v in data["ranges"].values())
    data["words"] = "; ".join("%s: %s" % (k, v["words"]) for k, v in data["ranges"].items())
    return data


def probe_dmabuf_chunks(drv, dev, emulator, ptx_dir, chunks=3):
    """What xseg_range_dmabuf needs (issue 51): cuMemGetHandleForAddressRange on one range over
    CHUNKS physical handles mapped side by side (the fd and its size, or the driver's words), and
    whether cuMemCreate takes the GPUDirect RDMA flag (gpu_direct_rdma:True)."""
    if not drv.has("cuMemGetHandleForAddressRange"):
        if emulator:
            raise Skip("cudaemu has no cuMemGetHandleForAddressRange: the real driver answers")
        return {"supported": False, "words": "this driver library has no cuMemGetHandleForAddressRange"}
    cu = drv.cu
    cu.cuMemGetHandleForAddressRange.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t,
                                                 ctypes.c_int, ctypes.c_ulonglong]
    for name, args in (("cuMemMap", [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64,
                                     ctypes.c_uint64]),
                       ("cuMemUnmap", [ctypes.c_uint64, ctypes.c_size_t]),
                       ("cuMemSetAccess", [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]),
                       ("cuMemAddressFree", [ctypes.c_uint64, ctypes.c_size_t]),
                       ("cuMemRelease", [ctypes.c_uint64])):
        getattr(cu, name).argtypes = args
    data = {"dma_buf_attribute": drv.attr(ATTR_DMA_BUF, dev), "rdma_vmm_attribute": drv.attr(ATTR_RDMA_VMM, dev),
            "chunks": chunks}
    prop = AllocationProp(type=1, requestedHandleTypes=0, location=Location(LOC_DEVICE, dev))
    gran = ctypes.c_size_t()
    drv.check("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), 0)
    g = gran.value
    handles, mapped, va = [], 0, ctypes.c_uint64()
    try:
        drv.check("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(chunks * g), ctypes.c_size_t(0),
                  ctypes.c_uint64(0), ctypes.c_uint64(0))
        for i in range(chunks):
            h = ctypes.c_uint64()
            drv.check("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(g), ctypes.byref(prop), ctypes.c_uint64(0))
            handles.append(h.value)
            drv.check("cuMemMap", va.value + i * g, g, 0, h.value, 0)
            mapped += 1
        access = AccessDesc(location=Location(LOC_DEVICE, dev), flags=3)
        drv.check("cuMemSetAccess", va.value, chunks * g, ctypes.addressof(access), 1)
        fd = ctypes.c_int(-1)
        try:
            drv.check("cuMemGetHandleForAddressRange", ctypes.byref(fd), va.value, chunks * g,
                      RANGE_HANDLE_DMA_BUF_FD, 0)
            size = os.fstat(fd.value).st_size
            data["range"] = {"supported": True, "bytes": chunks * g, "fd_size": size,
                             "words": "one fd for %d chunks of %d bytes: fd size %d" % (chunks, g, size)}
        except Refused as e:
            data["range"] = {"supported": False, "words": str(e)}
        finally:
            if fd.value >= 0:
                os.close(fd.value)
    finally:
        for i in range(mapped):
            cu.cuMemUnmap(va.value + i * g, g)
        for h in handles:
            cu.cuMemRelease(h)
        if va.value:
            cu.cuMemAddressFree(va.value, chunks * g)
    rdma = AllocationProp(type=1, requestedHandleTypes=0, location=Location(LOC_DEVICE, dev))
    rdma.allocFlags.gpuDirectRDMACapable = 1
    h = ctypes.c_uint64()
    try:
        drv.check("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(g), ctypes.byref(rdma), ctypes.c_uint64(0))
        try:
            data["rdma_flag"] = {"accepted": True, "words": "cuMemCreate(gpuDirectRDMACapable=1) succeeded",
                                 "pointer_attribute": rdma_pointer_attribute(drv, h.value, g, dev)}
        finally:
            cu.cuMemRelease(h.value)
    except Refused as e:
        data["rdma_flag"] = {"accepted": False, "words": str(e)}
    data["supported"] = data["range"]["supported"]
    data["words"] = "%s; RDMA flag: %s (attribute %s)" % (data["range"]["words"], data["rdma_flag"]["words"],
                                                           data["rdma_vmm_attribute"])
    if "pointer_attribute" in data["rdma_flag"]:
        data["words"] += "; cuPointerGetAttribute(IS_GPU_DIRECT_RDMA_CAPABLE) of such a chunk: %s" % (
            data["rdma_flag"]["pointer_attribute"])
    # The device says VMM memory supports GPUDirect RDMA and took the flag: a NIC must be able to
    # register the chunk (docs/registrations.md), so an answer of 0 is inconsistent.
    if data["rdma_vmm_attribute"] == 1 and data["rdma_flag"].get("pointer_attribute") == 0:
        raise AssertionError("a chunk made with gpuDirectRDMACapable=1 on a device reporting "
                             "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED answers IS_GPU_DIRECT_RDMA_CAPABLE 0")
    if data["range"]["supported"] and data["range"]["fd_size"] != chunks * g:
        raise AssertionError("the dma-buf of %d bytes has size %d" % (chunks * g, data["range"]["fd_size"]))
    return data


def rdma_pointer_attribute(drv, handle, g, dev):
    """What cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE) answers for HANDLE
    (G bytes, made with the RDMA flag, as xseg makes its pages) mapped at a fresh reservation: 0 or
    1 (an unsigned int), or the driver's words when it refuses. cudaemu answers 1 only with
    CUDAEMU_RDMA=1; the driver should answer 1 where the device reports RDMA with VMM."""
    cu = drv.cu
    va, mapped = ctypes.c_uint64(), False
    try:
        drv.check("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(g), ctypes.c_size_t(0),
                  ctypes.c_uint64(0), ctypes.c_uint64(0))
        drv.check("cuMemMap", va.value, g, 0, handle, 0)
        mapped = True
        access = AccessDesc(location=Location(LOC_DEVICE, dev), flags=3)
        drv.check("cuMemSetAccess", va.value, g, ctypes.addressof(access), 1)
        v = ctypes.c_uint(7)
        drv.check("cuPointerGetAttribute", ctypes.byref(v), ctypes.c_int(POINTER_ATTR_RDMA_CAPABLE),
                  ctypes.c_uint64(va.value))
        return v.value
    except Refused as e:
        return str(e)
    finally:
        if mapped:
            cu.cuMemUnmap(va.value, g)
        if va.value:
            cu.cuMemAddressFree(va.value, g)


class Skip(Exception):
    pass


def probes(emulator, ptx_dir):
    """Each probe prints one JSON line; one probe's failure hides no other."""
    import traceback
    try:
        drv = Driver()
        dev = probe_context(drv)
    except Exception as e:
        print(json.dumps({"name": "driver context for the probes", "status": "fail", "reason": str(e)}))
        return
    for name, fn in (("host-located VMM memory read and written by a kernel", probe_host_vmm),
                     ("one physical handle mapped at many addresses", probe_multimap),
                     ("dma-buf export (cuMemGetHandleForAddressRange)", probe_dmabuf),
                     ("whole-range dma-buf over chunks and the RDMA flag (xseg_range_dmabuf)",
                      probe_dmabuf_chunks)):
        t0 = time.perf_counter()
        try:
            data = fn(drv, dev, emulator, ptx_dir)
            line = {"name": name, "status": "pass", "data": data,
                    "reason": ("supported: " if data["supported"] else "not supported: ") + data["words"]}
        except Skip as e:
            line = {"name": name, "status": "skip", "reason": str(e), "data": None}
        except Refused as e:
            # a step around the probe failed (context, allocation): the driver's words, as a failure
            line = {"name": name, "status": "fail", "reason": str(e), "data": {"words": str(e)}}
        except Exception:
            line = {"name": name, "status": "fail", "reason": traceback.format_exc()[-2000:], "data": None}
        line["seconds"] = round(time.perf_counter() - t0, 3)
        print(json.dumps(line), flush=True)


def main(argv):
    if argv[:1] == ["info"]:
        print(json.dumps(info()))
    elif argv[:1] == ["remap"]:
        reps, sizes = 20, [2, 20, 64, 512]
        if "--reps" in argv:
            reps = int(argv[argv.index("--reps") + 1])
        if "--sizes" in argv:
            sizes = [int(x) for x in argv[argv.index("--sizes") + 1].split(",")]
        print(json.dumps(remap(reps, sizes)))
    elif argv[:1] == ["probes"]:
        ptx_dir = argv[argv.index("--ptx-dir") + 1] if "--ptx-dir" in argv else None
        probes("--emulator" in argv, ptx_dir)
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
