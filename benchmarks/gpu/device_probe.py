#!/usr/bin/env python3
"""Driver facts and one driver cost that bench_vmm_costs does not measure, straight through
ctypes (standard library) on libcuda.so.1, or on the library $XSEG_LIBCUDA names (cudaemu).

  device_probe.py info                  devices, names, VMM and fabric support, the peer matrix
  device_probe.py remap [--reps N] [--sizes MiB,...]
        the remap of a kept handle: one cuMemCreate, then N times map + set access + unmap of the
        same handle at the same address (what a segment does when it maps a page it kept), in
        microseconds per call (median, p10, p90)

Each prints one JSON object on stdout.
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
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
