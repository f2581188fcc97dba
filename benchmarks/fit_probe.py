#!/usr/bin/env python3
"""Why a trace does not fit (issue 33): replay it on a small emulated device and describe the first
failed allocation: the free runs of the large pool, the pages that hold free and live bytes at once
(what the reclaim cannot give back without moving live bytes), the live blocks pinning those pages
(size, when the trace allocated them and whether it frees them later), and when those pages were
first used (the trace's allocated high-water mark then, as a share of the device).

  benchmarks/fit_probe.py [--replay PATH] [--config STRING] [--ratio R | --device-mem BYTES]
                          [--page MIB] TRACE

The device is peak allocated (a replay on 80 GiB) x R (default 1.01) rounded up to 2 MiB, as in
fit_table.sh. Pages are the large pool's (--page, 20 MiB), counted from each mapped run's start;
with chunks smaller than a page (near a full device) a page is an upper bound on what is pinned.
Needs an emulator build of xseg-replay (it reads XSEG_OOM_SNAPSHOT and XSEG_REPLAY_ADDR_LOG).
"""
import argparse
import bisect
import collections
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile

MIB = 1 << 20


class NoGlobals(pickle.Unpickler):
    """xseg's snapshots are plain data (pickle protocol 2 without globals)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")


def replay(args, env_extra, device_mem=None):
    cmd = [args.replay, "--summary=json", "--marks=none", "--config", args.config]
    if device_mem:
        cmd += ["--device-mem", str(device_mem)]
    env = dict(os.environ, **env_extra)
    r = subprocess.run(cmd + [args.trace], capture_output=True, text=True, env=env)
    lines = r.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"fit_probe.py: {args.trace}: the replay failed: "
                         f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(lines[-1])


def read_trace(path):
    """alloc line -> (name, size); name -> free lines."""
    allocs, frees = {}, collections.defaultdict(list)
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            w = line.split()
            if len(w) >= 3 and w[0] == "alloc":
                allocs[i] = w[1]
            elif len(w) >= 2 and w[0] == "free":
                frees[w[1]].append(i)
    return allocs, frees


def read_log(path):
    """The live blocks just before the first failed allocation: addr -> (line, size); the failure
    (line, size); every allocation before it as (addr, size, allocated high-water mark then)."""
    live, by_buf, hw, cur, high = {}, {}, [], 0, 0
    with open(path) as f:
        for line in f:
            w = line.split()
            if w[0] == "a":
                ln, buf, addr, size = int(w[1]), w[2], int(w[3], 16), int(w[4])
                if addr == 0:
                    return live, (ln, size), hw
                live[addr] = (ln, size)
                by_buf[buf] = addr
                cur += size
                high = max(high, cur)
                hw.append((addr, size, high))
            elif w[0] == "f" and w[2] in by_buf:
                ln, size = live.pop(by_buf.pop(w[2]))
                cur -= size
    return live, None, hw


def pages_of(snapshot, page):
    """Per page (address): [live bytes, free bytes, live block addresses]; the free runs."""
    pages = collections.defaultdict(lambda: [0, 0, []])
    runs = []
    for seg in snapshot.get("segments", []):
        if seg.get("segment_type") != "large":
            continue
        base = seg["address"]
        for b in seg["blocks"]:
            a, n, free = b["address"], b["size"], b["state"] == "inactive"
            if free:
                runs.append(n)
            p = base + (a - base) // page * page
            while p < a + n:
                part = min(a + n, p + page) - max(a, p)
                pages[p][1 if free else 0] += part
                if not free:
                    pages[p][2].append(a)
                p += page
    return pages, runs


def quartiles(xs):
    xs = sorted(xs)
    return [xs[len(xs) * q // 4] for q in range(4)] + [xs[-1]] if xs else []


def report(args, device, allocs, frees, live, fail, hw, snapshot):
    page = args.page * MIB
    pages, runs = pages_of(snapshot, page)
    out = [f"device {device / MIB:,.0f} MiB; first failed allocation at line {fail[0]}: "
           f"{fail[1] / MIB:.1f} MiB"]
    partly = {p: v for p, v in pages.items() if v[0] and v[1]}
    out.append(f"large pool: {len(pages)} pages mapped; {len(partly)} hold live and free bytes, "
               f"{sum(v[1] for v in partly.values()) / MIB:,.0f} MiB free inside them")
    runs.sort(reverse=True)
    out.append("free runs (MiB, largest first): " + ", ".join(f"{n / MIB:.1f}" for n in runs[:12]) +
               f" ({len(runs)} in all)")
    pins = sorted({a for v in partly.values() for a in v[2] if a in live})
    sizes = collections.Counter(round(live[a][1] / MIB, 1) for a in pins)
    out.append(f"pinning live blocks: {len(pins)}; by size (MiB x count): " +
               ", ".join(f"{s} x {c}" for s, c in sizes.most_common(6)))

    def freed_later(a):
        ln = live[a][0]
        return any(f > fail[0] for f in frees.get(allocs.get(ln, ""), []) if f > ln)
    later = sum(freed_later(a) for a in pins)
    out.append(f"  freed later in the trace: {later}; never: {len(pins) - later}")
    out.append("  trace lines from their allocation to the failure (quartiles): " +
               ", ".join(str(x) for x in quartiles([fail[0] - live[a][0] for a in pins])))
    first, starts = {}, sorted(partly)
    for a, n, high in hw:  # in trace order: the first allocation that touched each page
        i = bisect.bisect_left(starts, a - page + 1)
        while i < len(starts) and starts[i] < a + n:
            first.setdefault(starts[i], high / device)
            i += 1
    bands = collections.Counter()
    for p, share in first.items():
        bands[round(share * 20) / 20] += partly[p][1]
    out.append("their free bytes by the allocated high-water mark when the page was first used "
               "(share of the device: MiB): " +
               ", ".join(f"{k:.2f}: {v / MIB:,.0f}" for k, v in sorted(bands.items())))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--replay", default=os.path.join("build", "tools", "xseg-replay"))
    ap.add_argument("--config", default="expandable_segments:True")
    ap.add_argument("--ratio", type=float, default=1.01)
    ap.add_argument("--device-mem", type=int)
    ap.add_argument("--page", type=int, default=20)
    args = ap.parse_args()
    if not os.path.isfile(args.trace):
        raise SystemExit(f"fit_probe.py: {args.trace}: no such trace file")
    if not os.access(args.replay, os.X_OK):
        raise SystemExit(f"fit_probe.py: {args.replay} is not an executable (--replay; ninja -C build)")
    if args.page <= 0 or args.ratio <= 0:
        raise SystemExit("fit_probe.py: --page and --ratio must be positive")
    device = args.device_mem
    if not device:
        peak = replay(args, {})["peak_allocated_bytes"]
        device = max((int(peak * args.ratio) + 2 * MIB - 1) // (2 * MIB) * 2 * MIB, 2 * MIB)
    with tempfile.TemporaryDirectory() as d:
        snap, log = os.path.join(d, "oom.pickle"), os.path.join(d, "addr.log")
        run = replay(args, {"XSEG_OOM_SNAPSHOT": snap, "XSEG_REPLAY_ADDR_LOG": log}, device)
        if not run.get("failed_allocs"):
            print(f"{args.trace}: no failed allocation on a device of {device / MIB:,.0f} MiB")
            return
        if not os.path.exists(snap) or not os.path.exists(log):
            raise SystemExit("fit_probe.py: the replay wrote no OOM snapshot or address log "
                             "(an emulator build of xseg-replay is needed)")
        live, fail, hw = read_log(log)
        with open(snap, "rb") as f:
            snapshot = NoGlobals(io.BytesIO(f.read())).load()
    if fail is None:
        raise SystemExit("fit_probe.py: the address log shows no failed allocation")
    allocs, frees = read_trace(args.trace)
    print(report(args, device, allocs, frees, live, fail, hw, snapshot))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, KeyError, pickle.UnpicklingError) as e:
        sys.exit(f"fit_probe.py: {e}")
