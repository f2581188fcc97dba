#!/usr/bin/env python3
"""The sleep/wake model table of docs/benchmarks.md: what cudaemu's h200 preset predicts for the build
the first H200 acceptance run measured (BASE, fcef840) and for this one, beside that run's figures.

  benchmarks/sleep_model_table.py BUILD [--base REV | --base-build DIR] [--gib G] [--reps R] [--h200 TGZ]

Both libraries run the same bench_services (BUILD's, `--sleep-only`) on BUILD's cudaemu with
CUDAEMU_LATENCY=h200: BASE's libxseg.so is put first on LD_LIBRARY_PATH (built from `git archive
REV` in a temporary folder unless --base-build names one). The H200's figures are read from the
run's logs (--h200, default ../shared/gpu-runs/2026-11-26-h200/run1-logs.tgz:
services/bench_services.json, `bench_services --gib 4 --reps 3` at fcef840). The modelled times are
cudaemu's timeline (cudaemu_model_ns), deterministic; wall times on cudaemu are this machine's
memcpy and are not shown. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_base(rev, tmp):
    src, out = os.path.join(tmp, "src"), os.path.join(tmp, "build")
    os.makedirs(src)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    subprocess.run(["meson", "setup", out, src, "-Dtests=disabled", "-Dbenchmarks=false", "-Dpython=disabled"],
                   check=True, capture_output=True)
    subprocess.run(["nice", "-n", "10", "ninja", "-C", out, "-j2"], check=True, capture_output=True)
    return out


def bench(build, libdir, gib, reps):
    env = dict(os.environ, CUDAEMU_LATENCY="h200", XSEG_LIBCUDA=os.path.join(build, "cudaemu", "libcudaemu.so"))
    if libdir:
        env["LD_LIBRARY_PATH"] = os.path.abspath(libdir) + (":" + env["LD_LIBRARY_PATH"]
                                                            if env.get("LD_LIBRARY_PATH") else "")
    cmd = [os.path.join(build, "benchmarks", "bench_services"), "--sleep-only", "--gib", str(gib), "--reps", str(reps)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    rows, link = {}, {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| sleep (") or line.startswith("| wake ("):
            # operation, live GiB, wall ms, GiB/s, pinned, x, modelled ms, modelled GiB/s, modelled copy, x, calls
            rows[cells[0]] = {"gib": float(cells[1]), "ms": float(cells[6]), "rate": float(cells[7]),
                              "copy": float(cells[8]), "x": float(cells[9])}
        elif line.startswith("| pinned copy") or line.startswith("| cuMemHostAlloc") or \
                line.startswith("| cuMemFreeHost"):
            link[cells[0]] = float(cells[2])
    return rows, link


def h200_rows(path):
    with tarfile.open(path) as t:
        tables = json.load(t.extractfile("./services/bench_services.json"))
    return {r[0]: float(r[2]) for r in tables[0][1:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--base", default="fcef840")
    ap.add_argument("--base-build")
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--h200", default=os.path.join(ROOT, "..", "shared", "gpu-runs", "2026-11-26-h200",
                                                   "run1-logs.tgz"))
    a = ap.parse_args()
    measured = h200_rows(a.h200)
    with tempfile.TemporaryDirectory() as tmp:
        base_build = a.base_build or build_base(a.base, tmp)
        base, _ = bench(a.build, base_build, a.gib, a.reps)
    this, link = bench(a.build, None, a.gib, a.reps)
    keep_off = "offload, sleep_keep_host_backup:False"
    print("| operation | H200, %s: measured ms | %s on the h200 model: ms | model / measured | this build on the "
          "h200 model: ms | GiB/s | x of the modelled pinned copy |" % (a.base, a.base))
    print("|---|---|---|---|---|---|---|")
    for op in ("sleep", "wake"):
        for mode in ("offload", "discard", keep_off):
            key = "%s (%s)" % (op, mode)
            # The measured run's default was a backup allocated and freed each cycle: its offload row
            # is what the base does with and without the option.
            m = measured.get(key) if mode != keep_off else measured.get("%s (offload)" % op)
            b, t = base[key], this[key]
            print("| %s | %s | %.1f | %s | %.1f | %.2f | %.2f |" % (
                key, "%.1f" % m if m else "", b["ms"], "%.2f" % (b["ms"] / m) if m else "", t["ms"], t["rate"],
                t["x"]))
    print()
    print("Modelled link of the same runs: %s." % ", ".join("%s %.2f" % (k, v) for k, v in link.items()))


if __name__ == "__main__":
    sys.exit(main())
