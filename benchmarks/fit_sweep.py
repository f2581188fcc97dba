#!/usr/bin/env python3
"""The fit band of issue 52: replay each trace on every emulated device from peak allocated x LO
(rounded up to 2 MiB) to peak allocated x HI in 2 MiB steps and list the sizes with a failed
allocation (the gaps). Fit is not monotonic in device size, so a bisection (--min-device) cannot
answer this; every size is replayed.

  benchmarks/fit_sweep.py [--replay PATH] [--config STRING] [--lo 1.01] [--hi 1.10] [--jobs N]
                          [--step MIB] TRACE_OR_DIR...

A folder stands for its *.trace files (convert PyTorch snapshots first with
tools/snapshot2trace.py; benchmarks/fit_table.sh does so). Peak allocated comes from a replay on an
80 GiB device, as in fit_table.sh, or on 1 TiB where that one fails (a trace that recorded an OOM).
One line per trace: the sizes replayed, the gaps (MiB, with the failed allocations) and the
smallest size from which every larger one up to HI fits. Exit status 1 when a trace has a gap.
Replays run on cudaemu, whose placements repeat exactly. An 80 GiB trace takes some 3,700 replays:
--step (a multiple of 2) samples the band more coarsely, and then says so (a sampled sweep can
miss a gap).
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", default="build/tools/xseg-replay")
    ap.add_argument("--config", default="")
    ap.add_argument("--lo", type=float, default=1.01)
    ap.add_argument("--hi", type=float, default=1.10)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--step", type=int, default=2, help="MiB between sizes, a multiple of 2 (default 2)")
    ap.add_argument("traces", nargs="+")
    args = ap.parse_args()
    if args.step < 2 or args.step % 2:
        ap.error("--step must be a multiple of 2 MiB")
    step = args.step * MIB
    traces = []
    for t in args.traces:
        if os.path.isdir(t):
            traces += sorted(os.path.join(t, f) for f in os.listdir(t) if f.endswith(".trace"))
        else:
            traces.append(t)
    bad = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for trace in traces:
            base = replay(args, trace)
            note = ""
            if base["failed_allocs"]:  # a recorded OOM: its peak is that of a device it fits on
                base = replay(args, trace, 1 << 40)
                note = " (fails on 80 GiB: peak from a 1 TiB device)"
            peak = base["peak_allocated_bytes"]
            band = sizes(peak, args.lo, args.hi, step)
            runs = list(pool.map(lambda m: replay(args, trace, m)["failed_allocs"], band))
            gaps = [(m, f) for m, f in zip(band, runs) if f]
            above = band[0]
            for m, f in zip(band, runs):
                if f:
                    above = m + step
            name = os.path.basename(trace).removesuffix(".trace")
            gap_text = ", ".join(f"{m // MIB} ({f})" for m, f in gaps) or "none"
            from_text = (f"{above // MIB} MiB (x {above / peak:.4f})" if above <= band[-1] else "none in the band")
            sampled = f" every {args.step} MiB (sampled)" if step != STEP else ""
            print(f"{name}: peak {peak / MIB:,.1f} MiB{note}, {len(band)} sizes {band[0] // MIB}-{band[-1] // MIB} MiB{sampled}, "
                  f"gaps (MiB, failed allocations): {gap_text}; every size fits from {from_text}",
                  flush=True)
            bad += bool(gaps)
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.exit(f"fit_sweep.py: {e}")
