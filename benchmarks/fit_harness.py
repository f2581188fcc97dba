#!/usr/bin/env python3
"""The fit harness: two builds or two configs side by side on every trace's fit band, and the
acceptance rule for a placement rule or constant, on a tuning half and a held-out half.

  benchmarks/fit_harness.py [--side NAME REPLAY CONFIG]... [--split] [--half both|tune|held-out]
                            [--seed S] [--lo 1.00] [--hi 1.10] [--step MIB] [--step-above GIB:MIB]
                            [--layout CONFIG] [--no-builtin] [--jobs N] [--cache DIR] [--markdown]
                            TRACE_OR_DIR...

Each side is a replay binary (a build's tools/xseg-replay) with a config string ('' for the
default); the first side is the baseline ("before"), the others candidates. Without --side: the
baseline and the candidate are both build/tools/xseg-replay with the default config. For every
trace (a folder stands for its *.trace and *.pickle files, snapshots converted as
benchmarks/fit_sweep.py does; the bundled workloads builtin:training and builtin:inference are
added unless --no-builtin) and every side, each emulated device from peak allocated x LO (rounded
up to 2 MiB) to x HI is replayed in STEP MiB steps (fit is not monotonic in device size), and the
row says:
  - fits from: the smallest gap-free device, the smallest size of the band from which every larger
    one replayed fits, in MiB and as a ratio to peak allocated ("above" when the band's last size
    fails);
  - gaps: the sizes that fail above one that fits (a range of failing sizes, MiB);
  - the PyTorch layout: fits from with --layout's config (default PyTorch's expandable layout as
    xseg models it, expandable_segments_recycle:False) on the last side's build, and the last
    side's fits from minus it (MiB).

The acceptance rule, printed as a verdict for each candidate against the baseline: on every trace
the candidate's fits from is at most one 2 MiB step above the baseline's, and the mean of fits
from / peak is lower (strictly). The goals are printed for each side too: every trace fits at
1.01 x peak allocated, no gap anywhere in the band, none needs more than the PyTorch layout by
more than one 2 MiB step.

--split: the traces are ranked by peak allocated and taken in consecutive pairs; a hash of the
pair's names and --seed sends one of each pair to the tuning half, the other to the held-out half
(an odd one out goes by its own name's hash), so both halves span the same sizes and a new trace
moves few others. Every candidate is measured on the tuning half; the one the rule accepts there
with the lowest mean (else the lowest mean, and the verdict says no candidate passed) is chosen
without a look at the held-out half, then measured there against the baseline. A rule lands when
both verdicts accept. --half tune replays only the tuning half (explore there without seeing the
other), --half held-out reports the held-out half only, for every candidate.

--cache DIR keeps each (replay binary and its cudaemu, config, trace, device size) result, so a
baseline is replayed once across runs. --markdown prints a caption, one table and the verdicts
for benchmarks/record.py, and exits 0 whatever they say; otherwise the exit status is 0 when
every verdict accepts, 1 when one rejects. Replays run on cudaemu, whose placements repeat
exactly; --step and --step-above sample the band more coarsely and say so (a sampled band can
miss a gap narrower than its step; the verdict's one step is then the sample's). A sampled band's
fits from is refined to 2 MiB: every size between the last failing sample and the fitting run
above it is replayed too, so the 1.01 x goal is judged at 2 MiB whatever the step.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit_sweep  # noqa: E402  (its replay, band and snapshot expansion)

MIB = 1 << 20
STEP = 2 * MIB
LAYOUT = "expandable_segments:True,expandable_segments_recycle:False"
BUILTIN = ["builtin:training", "builtin:inference"]


class Side:
    """A replay binary and a config string; its results cached by content."""

    def __init__(self, name, replay, config):
        self.name, self.replay, self.config = name, replay, config
        if not os.access(replay, os.X_OK):
            raise RuntimeError(f"side {name}: {replay} is not an executable (a build's tools/xseg-replay)")
        h = hashlib.sha256()
        emu = os.path.join(os.path.dirname(os.path.abspath(replay)), "..", "cudaemu", "libcudaemu.so")
        for f in (replay, emu):
            if os.path.exists(f):
                with open(f, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
        h.update(config.encode())
        self.key = h.hexdigest()[:20]


class Cache:
    """Failed allocations per (side, trace, device size); a JSON file per (side, trace) in DIR."""

    def __init__(self, path):
        self.path, self.mem, self.lock = path, {}, threading.Lock()
        if path:
            os.makedirs(path, exist_ok=True)

    def _file(self, side, tkey):
        return os.path.join(self.path, f"{side.key}-{tkey}.json")

    def table(self, side, tkey):
        with self.lock:
            k = (side.key, tkey)
            if k not in self.mem:
                t = {}
                if self.path and os.path.exists(self._file(side, tkey)):
                    try:
                        with open(self._file(side, tkey)) as f:
                            t = json.load(f)
                    except (OSError, ValueError):
                        t = {}
                self.mem[k] = t
            return self.mem[k]

    def save(self, side, tkey):
        if not self.path:
            return
        with self.lock:
            data = json.dumps(self.mem[(side.key, tkey)], sort_keys=True)
        tmp = self._file(side, tkey) + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, self._file(side, tkey))


def trace_key(path):
    if path.startswith("builtin:"):
        return hashlib.sha256(path.encode()).hexdigest()[:20]
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:20]


class Runner:
    def __init__(self, args, cache, pool):
        self.args, self.cache, self.pool = args, cache, pool

    def replay(self, side, trace, device_mem=None):
        ns = argparse.Namespace(replay=side.replay, config=side.config)
        return fit_sweep.replay(ns, trace, device_mem)

    def peak(self, side, trace, tkey):
        t = self.cache.table(side, tkey)
        if "peak" not in t:
            base = self.replay(side, trace)
            note = False
            if base["failed_allocs"]:  # a recorded OOM: its peak is that of a device it fits on
                base, note = self.replay(side, trace, 1 << 40), True
            t["peak"], t["oom"] = base["peak_allocated_bytes"], note
            self.cache.save(side, tkey)
        return t["peak"], t["oom"]

    def band(self, side, trace, tkey, peak):
        step = self.step_of(peak)
        band = fit_sweep.sizes(peak, self.args.lo, self.args.hi, step)
        t = self.cache.table(side, tkey)
        runs = t.setdefault("runs", {})
        self.fill(side, trace, tkey, runs, band)
        out = [(m, runs[str(m)]) for m in band]
        # A sampled band's fits from is refined to 2 MiB: every size between the last failing
        # sample and the first of the fitting run above it (the 1.01 x bar falls between samples).
        top = summarize(step, out, peak)["from"]
        if step > STEP and top is not None and top > band[0]:
            fine = list(range(top - step + STEP, top, STEP))
            self.fill(side, trace, tkey, runs, fine)
            out = sorted(out + [(m, runs[str(m)]) for m in fine])
        return step, out

    def fill(self, side, trace, tkey, runs, sizes):
        todo = [m for m in sizes if str(m) not in runs]
        for m, f in zip(todo, self.pool.map(lambda m: self.replay(side, trace, m)["failed_allocs"], todo)):
            runs[str(m)] = f
        if todo:
            self.cache.save(side, tkey)

    def step_of(self, peak):
        a = self.args
        if a.above_gib is not None and peak >= a.above_gib * (1 << 30):
            return int(a.above_step) * MIB
        return a.step * MIB


def summarize(step, runs, peak):
    """fits from (None: the band's last size fails), the gaps as (first, last, count) ranges."""
    fits_from = None
    for m, f in reversed(runs):
        if f:
            break
        fits_from = m
    first_fit = next((m for m, f in runs if not f), None)
    gaps, cur, prev = [], None, None
    for m, f in runs:
        if f and first_fit is not None and m > first_fit:
            if cur and cur[1] == prev:
                cur[1], cur[2] = m, cur[2] + 1
            else:
                cur = [m, m, 1]
                gaps.append(cur)
        prev = m
    return {"peak": peak, "step": step, "from": fits_from, "gaps": [tuple(g) for g in gaps],
            "n": len(runs), "band": (runs[0][0], runs[-1][0]) if runs else (0, 0),
            "at101": fits_from is not None and fits_from <= cap101(peak)}


def cap101(peak):
    """peak x 1.01 rounded up to 2 MiB (the 1 % bar of fit_table.sh)."""
    return max((peak * 101 // 100 + STEP - 1) // STEP * STEP, STEP)


def ratio(r):
    """fits from / peak; above the band counts as one step past its end."""
    end = r["from"] if r["from"] is not None else r["band"][1] + r["step"]
    return end / r["peak"] if r["peak"] else 1.0


def from_mib(r):
    return r["from"] if r["from"] is not None else r["band"][1] + r["step"]


def gaps_text(r):
    if not r["gaps"]:
        return "none"
    return ", ".join(f"{a // MIB:,}" if a == b else f"{a // MIB:,}–{b // MIB:,}" for a, b, _ in r["gaps"])


def from_text(r):
    if r["from"] is None:
        return "above"
    return f"{r['from'] // MIB:,} ({ratio(r):.4f})"


def verdict(base, cand, names):
    """The acceptance rule over @names: (accepted, mean base, mean cand, worse traces)."""
    if not names:
        return False, 0.0, 0.0, []
    worse = [n for n in names if from_mib(cand[n]) > from_mib(base[n]) + max(STEP, cand[n]["step"])]
    mb = sum(ratio(base[n]) for n in names) / len(names)
    mc = sum(ratio(cand[n]) for n in names) / len(names)
    return not worse and mc < mb, mb, mc, worse


def verdict_text(label, side, ok, mb, mc, worse, base, cand, n):
    why = []
    if worse:
        why.append("worse by more than one 2 MiB step on " + ", ".join(
            f"{w} (+{(from_mib(cand[w]) - from_mib(base[w])) // MIB} MiB)" for w in worse))
    if mc >= mb:
        why.append("the mean does not improve")
    return (f"verdict, {label} ({n} traces): {side} {'ACCEPTED' if ok else 'REJECTED'} against the baseline: "
            f"mean fits from / peak {mb:.4f} -> {mc:.4f}" + ("; " + "; ".join(why) if why else ""))


def goals_text(label, side, res, layout, names):
    if not names:
        return f"goals, {label}: no traces"
    miss = [n for n in names if not res[n]["at101"]]
    gaps = [n for n in names if res[n]["gaps"]]
    over = [n for n in names if layout.get(n) and from_mib(res[n]) > from_mib(layout[n]) + STEP]
    part = [f"{len(names) - len(miss)} of {len(names)} fit at 1.01 x peak allocated"
            + (f" (not: {', '.join(miss)})" if miss else ""),
            f"{len(names) - len(gaps)} with no gap" + (f" (gaps: {', '.join(gaps)})" if gaps else "")]
    if layout:
        part.append(f"{len(names) - len(over)} within one 2 MiB step of the PyTorch layout"
                    + (f" (over: {', '.join(over)})" if over else ""))
    return f"goals, {label}: {side}: " + "; ".join(part)


def split_halves(names, peaks, seed):
    """(tune, held) name lists: ranked by peak, consecutive pairs, one of each to each half by a hash."""
    ranked = sorted(names, key=lambda n: (peaks[n], n))
    tune, held = [], []

    def bit(text):
        return hashlib.sha256(f"{seed}:{text}".encode()).digest()[0] & 1

    for i in range(0, len(ranked), 2):
        pair = ranked[i:i + 2]
        if len(pair) == 1:
            (tune if bit(pair[0]) else held).append(pair[0])
            continue
        a, b = pair if bit("|".join(pair)) else pair[::-1]
        tune.append(a)
        held.append(b)
    return tune, held


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", nargs=3, action="append", metavar=("NAME", "REPLAY", "CONFIG"),
                    help="a build's xseg-replay and a config ('' for the default); the first is the baseline")
    ap.add_argument("--split", action="store_true", help="a tuning half and a held-out half")
    ap.add_argument("--half", choices=("both", "tune", "held-out"), default="both")
    ap.add_argument("--seed", default="1", help="the split's seed (default 1)")
    ap.add_argument("--lo", type=float, default=1.00)
    ap.add_argument("--hi", type=float, default=1.10)
    ap.add_argument("--step", type=int, default=2, help="MiB between sizes, a multiple of 2 (default 2)")
    ap.add_argument("--step-above", default="", metavar="GIB:MIB",
                    help="every MIB MiB (a multiple of 2) for traces of GIB GiB of peak or more")
    ap.add_argument("--layout", default=LAYOUT, help="the PyTorch layout's config ('none': not measured)")
    ap.add_argument("--no-builtin", action="store_true", help="without builtin:training and builtin:inference")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache", default="", metavar="DIR", help="keep every replay's result in DIR")
    ap.add_argument("--markdown", action="store_true", help="a caption, a Markdown table and the verdicts")
    ap.add_argument("traces", nargs="*")
    args = ap.parse_args()
    if args.step < 2 or args.step % 2:
        ap.error("--step must be a multiple of 2 MiB")
    if not 0 < args.lo < args.hi:
        ap.error("--lo and --hi want 0 < LO < HI")
    args.above_gib = args.above_step = None
    if args.step_above:
        try:
            args.above_gib, args.above_step = (float(x) for x in args.step_above.split(":"))
        except ValueError:
            ap.error("--step-above wants GIB:MIB, say 10:64")
        if args.above_gib <= 0 or args.above_step < 2 or args.above_step % 2:
            ap.error("--step-above wants GIB > 0 and MIB a multiple of 2")
    sides = args.side or [["before", "build/tools/xseg-replay", ""], ["after", "build/tools/xseg-replay", ""]]
    if len(sides) < 2:
        ap.error("--side wants a baseline and at least one candidate (give it twice or more)")
    if len({s[0] for s in sides}) != len(sides):
        ap.error("--side names must differ")
    if len(sides) > 2 and not args.split:
        ap.error("more than one candidate needs --split (one is chosen on the tuning half)")
    if args.half != "both" and not args.split:
        ap.error("--half needs --split")
    if not args.traces and args.no_builtin:
        ap.error("no traces: name a trace or a folder, or drop --no-builtin")
    sides = [Side(*s) for s in sides]
    with tempfile.TemporaryDirectory(prefix="fit_harness.") as tmp:
        traces = fit_sweep.expand(args.traces, tmp) + ([] if args.no_builtin else [(b, b) for b in BUILTIN])
        names = [n for n, _ in traces]
        if len(set(names)) != len(names):
            raise RuntimeError("two traces share a name: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            return run(args, sides, traces, Runner(args, Cache(args.cache), pool))


def measure(runner, side, traces, names, tkeys):
    out = {}
    for n in names:
        peak, oom = runner.peak(side, traces[n], tkeys[n])
        step, runs = runner.band(side, traces[n], tkeys[n], peak)
        out[n] = summarize(step, runs, peak)
        out[n]["oom"] = oom
        if not runner.args.markdown:
            r = out[n]
            print(f"  {side.name:>10} {n}: peak {peak / MIB:,.1f} MiB, {r['n']} sizes "
                  f"{r['band'][0] // MIB:,}-{r['band'][1] // MIB:,} every {step // MIB} MiB; "
                  f"fits from {from_text(r)}; gaps {gaps_text(r)}", file=sys.stderr, flush=True)
    return out


def run(args, sides, trace_list, runner):
    traces = dict(trace_list)
    tkeys = {n: trace_key(p) for n, p in trace_list}
    base, cands = sides[0], sides[1:]
    names = [n for n, _ in trace_list]
    peaks = {n: runner.peak(base, traces[n], tkeys[n])[0] for n in names}
    if args.split:
        tune, held = split_halves(names, peaks, args.seed)
    else:
        tune, held = names, []
    res = {s.name: {} for s in sides}
    layout_side = Side("layout", cands[-1].replay, args.layout) if args.layout != "none" else None
    layout = {}
    lines = []  # verdicts and goals, after the table
    ok_all = True
    chosen = cands[-1]
    if args.half in ("both", "tune"):
        res[base.name].update(measure(runner, base, traces, tune, tkeys))
        best = None
        for c in cands:
            res[c.name].update(measure(runner, c, traces, tune, tkeys))
            ok, mb, mc, worse = verdict(res[base.name], res[c.name], tune)
            lines.append(verdict_text("tuning half" if args.split else "all traces", c.name, ok, mb, mc, worse,
                                      res[base.name], res[c.name], len(tune)))
            key = (not ok, mc)
            if best is None or key < best[0]:
                best = (key, c)
        chosen = best[1]
        if len(cands) > 1:
            lines.append(f"chosen on the tuning half: {chosen.name}" +
                         ("" if not best[0][0] else " (no candidate passed the rule there: the lowest mean)"))
        ok_all &= not best[0][0]
    held_sides = cands if args.half == "held-out" else [chosen]
    if args.split and args.half in ("both", "held-out"):
        res[base.name].update(measure(runner, base, traces, held, tkeys))
        for c in held_sides:
            res[c.name].update(measure(runner, c, traces, held, tkeys))
            ok, mb, mc, worse = verdict(res[base.name], res[c.name], held)
            lines.append(verdict_text("held-out half", c.name, ok, mb, mc, worse, res[base.name], res[c.name],
                                      len(held)))
            ok_all &= ok
    shown = [n for n in names if n in res[base.name]]
    last = held_sides[-1] if args.half == "held-out" else chosen
    if layout_side:
        layout_side = Side("layout", last.replay, args.layout)
        layout = measure(runner, layout_side, traces, shown, tkeys)
    for s in (base, last):
        lines.append(goals_text("every trace shown", s.name, res[s.name], layout,
                                [n for n in shown if n in res[s.name]]))
    report(args, base, last, res, layout, shown, tune, held, lines)
    return 0 if args.markdown or ok_all else 1


def report(args, base, cand, res, layout, shown, tune, held, lines):
    a, b = res[base.name], res[cand.name]
    rows = sorted(shown, key=lambda n: (0 if n in tune else 1, a[n]["peak"], n)) if args.split else shown
    steps = {a[n]["step"] for n in shown}
    rule = f"every {args.step} MiB"
    if args.above_gib is not None:
        rule += (f" for a peak under {args.above_gib:g} GiB, every {args.above_step:g} MiB from "
                 f"{args.above_gib:g} GiB on (sampled: a gap narrower than the step can hide)")
    bdesc = f"`{base.config}`" if base.config else "the default config"
    cdesc = f"`{cand.config}`" if cand.config else "the default config"
    if args.markdown:
        split = ""
        if args.split:
            split = (f" Split (--seed {args.seed}): traces ranked by peak allocated, one of each consecutive "
                     f"pair to each half by a hash of their names; the candidate is chosen on the tuning half "
                     f"and proven on the held-out half.")
        print(f"Each trace replayed on every emulated device from peak allocated × {args.lo:.2f} (rounded up "
              f"to 2 MiB) to × {args.hi:.2f}, {rule}: {base.name} ({base.replay}, {bdesc}) against "
              f"{cand.name} ({cand.replay}, {cdesc}), and PyTorch's expandable layout as xseg models it "
              f"(`{args.layout}`, {cand.name}'s build). Fits from: the smallest device from which every "
              f"larger one fits (MiB, / peak allocated); gaps: failing sizes above one that fits (MiB); "
              f"Δ: {cand.name} − {base.name} (MiB); vs layout: {cand.name} − the layout (MiB).{split}\n")
        half = "| half " if args.split else ""
        print(f"{half}| trace | peak allocated (MiB) | step (MiB) | {base.name}: fits from | {base.name}: gaps | "
              f"{cand.name}: fits from | {cand.name}: gaps | Δ | layout: fits from | vs layout |")
        print(("|---" * (10 + bool(args.split))) + "|")
    for n in rows:
        ra, rb, rl = a[n], b.get(n), layout.get(n)
        if rb is None:
            continue
        d = (from_mib(rb) - from_mib(ra)) // MIB
        vl = f"{(from_mib(rb) - from_mib(rl)) // MIB:+d}" if rl else "—"
        star = " ¹" if ra.get("oom") else ""
        samp = " (sampled)" if ra["step"] != STEP else ""
        if args.markdown:
            h = f"| {'tune' if n in tune else 'held-out'} " if args.split else ""
            print(f"{h}| {n}{star} | {ra['peak'] / MIB:,.1f} | {ra['step'] // MIB}{samp} | {from_text(ra)} | "
                  f"{gaps_text(ra)} | {from_text(rb)} | {gaps_text(rb)} | {d:+d} | "
                  f"{from_text(rl) if rl else '—'} | {vl} |")
        else:
            h = f"[{'tune' if n in tune else 'held-out'}] " if args.split else ""
            print(f"{h}{n}: peak {ra['peak'] / MIB:,.1f} MiB, every {ra['step'] // MIB} MiB{samp}; "
                  f"{base.name} fits from {from_text(ra)}, gaps {gaps_text(ra)}; "
                  f"{cand.name} fits from {from_text(rb)}, gaps {gaps_text(rb)}; delta {d:+d} MiB; "
                  f"layout {from_text(rl) if rl else '-'} ({vl} MiB)")
    if args.markdown:
        print()
        if any(a[n].get("oom") for n in rows):
            print("¹ recorded an OOM: fails on 80 GiB, so its peak is that of a replay on a 1 TiB device.\n")
        if len(steps) > 1 or STEP not in steps:
            print("A sampled row's one-step tolerance is its sample's step.\n")
    print(("\n\n" if args.markdown else "\n").join(lines))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.exit(f"fit_harness.py: {e}")
