#!/usr/bin/env python3
"""The H100 tables of docs/benchmarks.md, from the raw outputs of that session (docs/gpu-h100/):
compare_pytorch.py's lines (frag), train_transformer.py's (train) and bench_vmm_costs --csv (vmm).
A run of benchmarks/gpu/run.sh replaces them with benchmarks/gpu/tables.py's. Standard library only.

usage: benchmarks/gpu/h100_tables.py DIR frag|train|vmm
"""
import csv
import os
import sys


def machine(d):
    with open(os.path.join(d, "vmm_costs.csv")) as f:
        row = next(csv.DictReader(f))
    v = int(row["driver_version"])
    return "machine: %s, CUDA driver API %d.%d (raw outputs in %s)" % (
        row["device"], v // 1000, v % 1000 // 10, os.path.relpath(d))


def frag(d):
    names = ("native", "native-exp", "async", "xseg")
    rows = {}
    for line in open(os.path.join(d, "pytorch_compare.txt")).read().splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[1] in names:  # trace allocator peak GiB resv GiB util ...
            trace = f[0].replace("memory_", "").replace(".trace", "")
            rows.setdefault(trace, {})[f[1]] = "%s (%.3f)" % (f[4], float(f[6]))
    print("| trace | peak reserved GiB (utilization): native | native-exp | async | **xseg** |")
    print("|---|---|---|---|---|")
    for trace, r in rows.items():
        print("| %s | %s | %s | %s | **%s** |" % ((trace,) + tuple(r.get(n, "n/a") for n in names)))


def train(d):
    label = {"native": "PyTorch native", "native-exp": "PyTorch expandable_segments",
             "async": "cudaMallocAsync", "xseg": "xseg (default)", "xseg-classic": "xseg classic"}
    print("| allocator | peak allocated | peak reserved | utilization | step (median) | ns per pair |")
    print("|---|---|---|---|---|---|")
    for line in open(os.path.join(d, "train_transformer.txt")).read().splitlines()[2:]:
        f = line.split()  # name alloc G resv G util end G step ns
        if len(f) == 10 and f[0] in label:
            print("| %s | %s GiB | %s GiB | %s | %s ms | %s |"
                  % (label[f[0]], f[1], f[3], f[5], f[8], "{:,}".format(int(f[9]))))


def vmm(d):
    ops = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "cuMemAlloc", "cuMemFree")
    cells = {}
    with open(os.path.join(d, "vmm_costs.csv")) as f:
        for r in csv.DictReader(f):
            cells.setdefault(int(r["page_mib"]), {})[r["op"]] = "%.1f (%.1f–%.1f)" % (
                float(r["median_us"]), float(r["p10_us"]), float(r["p90_us"]))
    print("| page | " + " | ".join(ops) + " |")
    print("|---|" + "---|" * len(ops))
    for mib in sorted(cells):
        page = "%d GiB" % (mib // 1024) if mib >= 1024 else "%d MiB" % mib
        print("| %s | %s |" % (page, " | ".join(cells[mib].get(o, "n/a") for o in ops)))


def main(argv):
    if len(argv) != 2 or argv[1] not in ("frag", "train", "vmm"):
        sys.exit(__doc__.strip().splitlines()[-1])
    print(machine(argv[0]))
    {"frag": frag, "train": train, "vmm": vmm}[argv[1]](argv[0])


if __name__ == "__main__":
    main(sys.argv[1:])
