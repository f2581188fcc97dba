#!/usr/bin/env python3
"""Fit after a warm run: every trace replayed twice in one process, the allocator warm for the
second pass, under a memory fraction at the cold run's own peak.

  benchmarks/fit_warm.py [--side NAME REPLAY]... [--device-mem SIZE] [--jobs N] [--markdown]
                         TRACE_OR_DIR...

What GPU runs do (benchmarks/gpu/compare_pytorch.py --min-fraction): a trace runs uncapped, every
tensor is dropped, the cache emptied, and the trace runs again under
set_per_process_memory_fraction. So for each trace (folders and snapshots expanded as
benchmarks/fit_sweep.py does) and each side (a build's tools/xseg-replay, default config):
  1. cold: one pass; its peak reserved is R;
  2. warm: pass one, every live buffer freed, empty_cache, pass two; the row gives pass two's
     peak reserved above R (MiB; 0 when the warm pass needs no more than the cold one);
  3. capped: the same two passes with per_process_memory_fraction set to R (x 1 + 1e-6) before
     the first; the row gives the failed allocations of each pass.
A side passes a trace when the capped second pass fails nothing. Replays run on cudaemu (one
device of --device-mem, default 141G, an H200's size), whose placements repeat exactly. Exit 0
when every side passes every trace (always with --markdown, which prints a caption and a table
for benchmarks/record.py).
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit_sweep  # noqa: E402  (its snapshot expansion)

MIB = 1 << 20
BUFFER_VERBS = ("alloc", "free", "record")


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def two_passes(trace, out, fraction):
    """Write @p trace twice to @p out: the second pass's buffers renamed, every buffer still live
    after the first freed, then empty_cache; with @p fraction, the cap before the first pass.
    Returns the second pass's first line number."""
    head, body = [], []
    with open(trace) as f:
        for line in f:
            word = line.split(maxsplit=1)[0] if line.strip() else ""
            (head if word in ("stream", "frame") or word.startswith("#") or not word else body).append(line.rstrip("\n"))
    live = {}
    for line in body:
        p = line.split()
        if p[0] == "alloc":
            live[p[1]] = True
        elif p[0] == "free":
            live.pop(p[1], None)
    lines = list(head)
    if fraction is not None:
        lines.append("config per_process_memory_fraction:%.12f" % fraction)
    lines += body
    lines += ["free %s" % b for b in live]
    lines.append("empty_cache")
    second = len(lines) + 1
    for line in body:
        p = line.split()
        if p[0] in BUFFER_VERBS:
            p[1] = "w_" + p[1]
        lines.append(" ".join(p))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return second


def replay(binary, trace, device_mem):
    """(summary dict, failed allocation line numbers) of one replay."""
    r = subprocess.run([binary, "--device-mem", device_mem, "--marks=none", "--summary=json", trace],
                       capture_output=True, text=True, check=False)
    summary = None
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            summary = json.loads(line)
    if summary is None:
        raise RuntimeError("%s %s: no summary (exit %d): %s" % (binary, trace, r.returncode, r.stderr[-400:]))
    failed = []
    for line in r.stderr.splitlines():
        # "TRACE:LINE: alloc BUF SIZE failed (...)"
        if line.startswith(trace + ":") and " failed (" in line:
            failed.append(int(line[len(trace) + 1:].split(":", 1)[0]))
    return summary, failed


def measure(binary, name, trace, device_mem, tmp):
    total = parse_size(device_mem)
    cold, _ = replay(binary, trace, device_mem)
    peak = cold["peak_reserved_bytes"]
    warm_path = os.path.join(tmp, name + ".warm.trace")
    two_passes(trace, warm_path, None)
    warm, _ = replay(binary, warm_path, device_mem)
    cap_path = os.path.join(tmp, name + ".capped.trace")
    second = two_passes(trace, cap_path, peak * (1 + 1e-6) / total)
    _, failed = replay(binary, cap_path, device_mem)
    return {"cold_reserved": peak, "warm_above": max(0, warm["peak_reserved_bytes"] - peak),
            "failed_first": sum(1 for n in failed if n < second),
            "failed_second": sum(1 for n in failed if n >= second),
            "cold_failed": cold["failed_allocs"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", nargs=2, action="append", metavar=("NAME", "REPLAY"), default=[])
    ap.add_argument("--device-mem", default="141G")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("traces", nargs="+")
    args = ap.parse_args()
    sides = args.side or [["xseg", "build/tools/xseg-replay"]]
    with tempfile.TemporaryDirectory() as tmp:
        traces = fit_sweep.expand(args.traces, tmp)
        jobs = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            for si, (sname, binary) in enumerate(sides):
                for name, path in traces:
                    work = os.path.join(tmp, "s%d" % si)
                    os.makedirs(work, exist_ok=True)
                    jobs[(sname, name)] = ex.submit(measure, binary, name, path, args.device_mem, work)
        res = {k: f.result() for k, f in jobs.items()}
    names = [n for n, _ in traces]
    ok = all(res[(s, n)]["failed_second"] == 0 and res[(s, n)]["failed_first"] == 0 for s, _ in sides for n in names)
    if args.markdown:
        print("Fit after a warm run (`benchmarks/fit_warm.py`): each trace replayed cold, then twice in one "
              "process with every buffer freed and `empty_cache` between the passes; capped: both passes "
              "under `per_process_memory_fraction` at the cold run's peak reserved (as the GPU run's "
              "compare_pytorch.py --min-fraction bisects). cudaemu, one %s device." % args.device_mem)
        print()
    hdr = ["trace", "cold peak reserved (MiB)"]
    for s, _ in sides:
        hdr += ["%s: warm pass above cold (MiB)" % s, "%s: capped failures (pass 1 / 2)" % s]
    rows = []
    for n in names:
        r0 = res[(sides[0][0], n)]
        row = [n, "%.0f" % (r0["cold_reserved"] / MIB)]
        for s, _ in sides:
            r = res[(s, n)]
            row += ["%.0f" % (r["warm_above"] / MIB), "%d / %d" % (r["failed_first"], r["failed_second"])]
        rows.append(row)
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for s, _ in sides:
        bad = [n for n in names if res[(s, n)]["failed_second"] or res[(s, n)]["failed_first"]]
        above = [n for n in names if res[(s, n)]["warm_above"]]
        print()
        print("%s: %d of %d traces fit warm under the cold peak%s; %d need more reserved warm than cold%s." % (
            s, len(names) - len(bad), len(names), (" (not: %s)" % ", ".join(bad)) if bad else "",
            len(above), (" (%s)" % ", ".join(above)) if above else ""))
    return 0 if ok or args.markdown else 1


if __name__ == "__main__":
    sys.exit(main())
