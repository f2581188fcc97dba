#!/usr/bin/env python3
"""The fit band of issue 52: replay each trace on every emulated device from peak allocated x LO
(rounded up to 2 MiB) to peak allocated x HI in 2 MiB steps and list the sizes with a failed
allocation (the gaps). Fit is not monotonic in device size, so a bisection (--min-device) cannot
answer this; every size is replayed.

  benchmarks/fit_sweep.py [--replay PATH] [--config STRING] [--lo 1.01] [--hi 1.10] [--jobs N]
                          [--step MIB] [--step-above GIB:MIB] [--markdown] TRACE_OR_DIR...

A folder stands for its *.trace and *.pickle files; a PyTorch snapshot (*.pickle) is converted
with tools/snapshot2trace.py into a temporary folder, a trace per device with data (NAME, or
NAME-devN when there are several, as benchmarks/fit_table.sh names them). Peak allocated comes from a replay on an
80 GiB device, as in fit_table.sh, or on 1 TiB where that one fails (a trace that recorded an OOM).
One line per trace: the sizes replayed, the gaps (MiB, with the failed allocations) and the
smallest size from which every larger one up to HI fits. Exit status 1 when a trace has a gap.
Replays run on cudaemu, whose placements repeat exactly. An 80 GiB trace takes some 3,700 replays:
--step (a multiple of 2) samples the band more coarsely, and then says so (a sampled sweep can
miss a gap); --step-above GIB:MIB samples every MIB only the traces of GIB GiB of peak or more.
--markdown prints a caption and a table instead (a row per trace: peak, the sizes and step,
the gaps, the smallest size from which every larger one fits) for benchmarks/record.py, and exits
0 whatever the gaps (the table shows them).
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20
STEP = 2 * MIB


def replay(args, trace, device_mem=None):
    cmd = [args.replay, "--summary=json", "--marks=none", "--config", args.config]
    if device_mem:
        cmd += ["--device-mem", str(device_mem)]
    try:
        out = subprocess.run(cmd + [trace], capture_output=True, text=True, check=False).stdout
    except OSError as e:
        raise RuntimeError(f"cannot run {args.replay}: {e.strerror}") from None
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"{trace}: replay printed no summary")
    return json.loads(lines[-1])


def sizes(peak, lo, hi, step):
    """Every @step from peak x lo rounded up to 2 MiB (as fit_table.sh) up to peak x hi."""
    first = max((peak * round(lo * 100) // 100 + STEP - 1) // STEP * STEP, STEP)
    last = int(peak * hi) // STEP * STEP
    return list(range(first, max(last, first) + 1, step))


def expand(paths, tmp):
    """(name, trace path) of each argument: a folder's *.trace and *.pickle, snapshots converted."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for t in paths:
        files = [t]
        if os.path.isdir(t):
            files = sorted(os.path.join(t, f) for f in os.listdir(t) if f.endswith((".trace", ".pickle")))
        for f in files:
            name = os.path.basename(f).removesuffix(".trace").removesuffix(".pickle")
            if not f.endswith(".pickle"):
                out.append((name, f))
                continue
            name = name.removeprefix("memory_")
            d = tempfile.mkdtemp(dir=tmp)
            conv = subprocess.run([sys.executable, os.path.join(here, "..", "tools", "snapshot2trace.py"),
                                   "--out-dir", d, f], capture_output=True, text=True, check=False)
            if conv.returncode:
                raise RuntimeError(f"{f}: snapshot2trace.py failed: {conv.stderr.strip()}")
            devs = [l.split("\t") for l in conv.stdout.splitlines() if l.strip()]
            for dev, path, *_ in devs:
                out.append((f"{name}-dev{dev}" if len(devs) > 1 else name, path))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", default="build/tools/xseg-replay")
    ap.add_argument("--config", default="")
    ap.add_argument("--lo", type=float, default=1.01)
    ap.add_argument("--hi", type=float, default=1.10)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--step", type=int, default=2, help="MiB between sizes, a multiple of 2 (default 2)")
    ap.add_argument("--step-above", default="", metavar="GIB:MIB",
                    help="every MIB MiB (a multiple of 2) for traces of GIB GiB of peak or more")
    ap.add_argument("--markdown", action="store_true", help="a caption and a Markdown table")
    ap.add_argument("traces", nargs="+")
    args = ap.parse_args()
    if args.step < 2 or args.step % 2:
        ap.error("--step must be a multiple of 2 MiB")
    above_gib = above_step = None
    if args.step_above:
        try:
            above_gib, above_step = (float(x) for x in args.step_above.split(":"))
        except ValueError:
            ap.error("--step-above wants GIB:MIB, say 10:64")
        if above_gib <= 0 or above_step < 2 or above_step % 2:
            ap.error("--step-above wants GIB > 0 and MIB a multiple of 2")
    with tempfile.TemporaryDirectory(prefix="fit_sweep.") as tmp:
        return sweep_all(args, expand(args.traces, tmp), above_gib, above_step)


def sweep_all(args, traces, above_gib, above_step):
    bad = 0
    oom_any = False
    if args.markdown:
        rule = f"every {args.step} MiB"
        if above_gib is not None:
            rule += (f" for a peak under {above_gib:g} GiB, every {above_step:g} MiB from "
                     f"{above_gib:g} GiB on (those rows are sampled: a gap narrower than the step can hide)")
        cfg = f"`{args.config}`" if args.config else "the default config"
        print(f"Each trace replayed with {cfg} on every emulated device from peak allocated × "
              f"{args.lo:.2f} (rounded up to 2 MiB) to × {args.hi:.2f}, {rule}. Gaps: the sizes (MiB) "
              f"with failed allocations (their count). Fits from: the smallest size of the band from "
              f"which every larger one replayed fits, and its ratio to peak allocated.\n")
        print("| trace | peak allocated (MiB) | sizes replayed (MiB) | step (MiB) | gaps (MiB: failed allocations) | fits from (MiB) | / peak |")
        print("|---|---|---|---|---|---|---|")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for name, trace in traces:
            base = replay(args, trace)
            note = ""
            if base["failed_allocs"]:  # a recorded OOM: its peak is that of a device it fits on
                base = replay(args, trace, 1 << 40)
                note = " (fails on 80 GiB: peak from a 1 TiB device)"
            peak = base["peak_allocated_bytes"]
            step = args.step * MIB
            if above_gib is not None and peak >= above_gib * (1 << 30):
                step = int(above_step) * MIB
            band = sizes(peak, args.lo, args.hi, step)
            runs = list(pool.map(lambda m: replay(args, trace, m)["failed_allocs"], band))
            gaps = [(m, f) for m, f in zip(band, runs) if f]
            above = band[0]
            for m, f in zip(band, runs):
                if f:
                    above = m + step
            bad += bool(gaps)
            if args.markdown:
                cell = ", ".join(f"{m // MIB:,}: {f}" for m, f in gaps) or "none"
                mark = " (sampled)" if step != STEP else ""
                star = " ¹" if note else ""
                fits = (f"{above // MIB:,} | {above / peak:.4f}" if above <= band[-1] else "none in the band | —")
                print(f"| {name}{star} | {peak / MIB:,.1f} | {len(band)}: {band[0] // MIB:,}–{band[-1] // MIB:,} | "
                      f"{step // MIB}{mark} | {cell} | {fits} |", flush=True)
                oom_any |= bool(note)
                continue
            gap_text = ", ".join(f"{m // MIB} ({f})" for m, f in gaps) or "none"
            from_text = (f"{above // MIB} MiB (x {above / peak:.4f})" if above <= band[-1] else "none in the band")
            sampled = f" every {step // MIB} MiB (sampled)" if step != STEP else ""
            print(f"{name}: peak {peak / MIB:,.1f} MiB{note}, {len(band)} sizes {band[0] // MIB}-{band[-1] // MIB} MiB{sampled}, "
                  f"gaps (MiB, failed allocations): {gap_text}; every size fits from {from_text}",
                  flush=True)
    if args.markdown:
        if oom_any:
            print("\n¹ recorded an OOM: fails on 80 GiB, so its peak is that of a replay on a 1 TiB device.")
        print(f"\n{len(traces) - bad} of {len(traces)} traces with no gap in the band.")
        return 0
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.exit(f"fit_sweep.py: {e}")
