#!/usr/bin/env python3
"""Can a rule that sees only what an allocator knows at malloc time tell which blocks live long?
(issue 33: the replay's oracle fits the fullstep traces by keeping never-freed blocks apart.)
For each trace, among large-pool requests (over 1 MiB), the truth is "never freed in the trace"
(--life N: or freed more than N actions after its allocation, as XSEG_REPLAY_ORACLE=N). Per rule:
how many it predicts long, precision and recall by count, and the bytes it gets wrong each way.

  for f in SNAPDIR/*.pickle; do tools/snapshot2trace.py --out-dir DIR/$(basename $f .pickle) $f; done
  (keep the frames: stack-live needs them)
  benchmarks/lifetime_probe.py [--life N] [--min-size BYTES] [--write-mask RULE FILE] DIR...

--write-mask RULE FILE writes the action index of each scored request RULE predicts long, one per
line, for `XSEG_REPLAY_ORACLE=file:FILE xseg-replay TRACE` (DIR must then hold one trace): how the
rule's guesses place, beside XSEG_REPLAY_ORACLE=never's truth. Seeds and requests of min-size or
less are never in it (the oracle's `never` routes those too when never freed).

DIR holds .trace files (found recursively; snapshot2trace writes one per device). Actions are
counted as the oracle counts them: every line but blanks, comments and frames. The leading `pre*`
allocations snapshot2trace seeds (live before the recording began) are live blocks to the rules
but are not scored. Every rule sees the state just before the malloc, nothing later:
  all            every large request (precision = the share that is long-lived)
  frees>mallocs  more than half of the last 64 mallocs and frees were frees
  old-twin       a live block of exactly this size was allocated more than 1000 actions ago
  at-high        allocated bytes are within 1 % of their high-water mark so far
  size-live      the last 4 earlier blocks of this size, stream and pool (at least 2) are live
  size-live+frees  both
  stack-live     the last 2 earlier blocks from this call stack are live (the alloc's `^STACK`;
                 PyTorch records stacks only with history on): traces with frames only
Requiring earlier blocks to have lived more than 1000 actions instead of being live predicts
almost nothing (0.2 % recall, stacks 0 %): a window's long-lived blocks come in bursts.
"""
import argparse
import collections
import os
import re
import sys

MIB = 1 << 20
WINDOW, AGE = 64, 1000
UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": MIB, "mb": MIB,
         "mib": MIB, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
         "tib": 1 << 40}
SIZE = re.compile(r"(\d+)(?:\.(\d{1,9}))?([A-Za-z]*)$")


def parse_size(text):
    m = SIZE.match(text)
    if not m or m.group(3).lower() not in UNITS:
        raise ValueError(f"bad size {text!r}")
    unit, frac = UNITS[m.group(3).lower()], m.group(2) or ""
    return int(m.group(1)) * unit + int(frac or 0) * unit // 10 ** len(frac)


def read_actions(path):
    """[(line number, words)] of the trace's actions (frames and comments left out)."""
    acts = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            w = re.split(r"\s#", line, maxsplit=1)[0].split()
            if w and not w[0].startswith("#") and w[0] != "frame":
                acts.append((n, w))
    return acts


class Req:
    """What the allocator knows at a malloc: the request and the state before it."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def still_live(self, prior, depth):
        """The last `depth` earlier blocks of a key (at least 2 of them) are all still live."""
        prior = prior[-depth:]
        return len(prior) >= min(depth, 2) and not any(j in self.freed_after for j in prior)


RULES = {
    "all": lambda r: True,
    "frees>mallocs": lambda r: r.frees_lead,
    "old-twin": lambda r: r.twin_age > AGE,
    "at-high": lambda r: r.allocated >= 0.99 * r.high,
    "size-live": lambda r: r.still_live(r.same_key, 4),
    "size-live+frees": lambda r: r.frees_lead and r.still_live(r.same_key, 4),
    "stack-live": lambda r: r.stack is not None and r.still_live(r.same_stack, 2),
}


def read_truth(path, acts):
    """alloc action index -> its lifetime in actions (None: never freed)."""
    owner, truth = {}, {}  # buffer -> its live alloc's action index
    for i, (n, w) in enumerate(acts):
        if w[0] == "alloc":
            if len(w) < 3:
                raise ValueError(f"{path}:{n}: alloc needs a buffer and a size")
            if w[1] in owner:
                raise ValueError(f"{path}:{n}: alloc {w[1]}: the buffer is live")
            owner[w[1]] = i
            truth[i] = None
        elif w[0] == "free":
            if len(w) < 2 or w[1] not in owner:
                raise ValueError(f"{path}:{n}: free {' '.join(w[1:2])}: no live buffer of that name")
            j = owner.pop(w[1])
            truth[j] = i - j
    return truth


def requests(path):
    """Replay the trace's books; yield (Req, lifetime or None) per alloc after the seeds."""
    acts = read_actions(path)
    truth = read_truth(path, acts)
    recent = collections.deque(maxlen=WINDOW)  # 1 per free, 0 per malloc
    live, by_size, freed_after = {}, collections.defaultdict(dict), {}
    by_key, by_stack = collections.defaultdict(list), collections.defaultdict(list)
    routes = {}  # stream or "*" -> pool of a pool_begin or capture_begin in force
    seeding, allocated, high = True, 0, 0
    for i, (n, w) in enumerate(acts):
        op = w[0]
        if op == "alloc":
            try:
                size = parse_size(w[2])
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
            stream = next((x for x in w[3:] if x.startswith("@")), "@default")
            stack = next((x for x in w[3:] if x.startswith("^")), None)
            key = (size, stream, routes.get(stream, routes.get("*")))
            seeding = seeding and w[1].startswith("pre")
            if not seeding:
                twins = by_size[size]
                yield Req(t=i, size=size, stream=stream, stack=stack, freed_after=freed_after,
                          frees_lead=2 * sum(recent) > len(recent),
                          twin_age=i - min(twins) if twins else 0,
                          same_key=by_key[key], same_stack=by_stack[stack],
                          allocated=allocated, high=high, live=live), truth[i]
            live[w[1]] = (i, size)
            twins = by_size[size]
            twins[i] = True
            by_key[key].append(i)
            if stack:
                by_stack[stack].append(i)
            recent.append(0)
            allocated += size
            high = max(high, allocated)
        elif op == "free":
            j, size = live.pop(w[1])
            del by_size[size][j]
            freed_after[j] = i - j
            recent.append(1)
            allocated -= size
        elif op in ("pool_begin", "capture_begin") and len(w) >= 2:
            stream = next((x for x in w[1:] if x.startswith("@")), "*")
            routes[stream] = next((x for x in w[1:] if not x.startswith("@")), "capture" + stream)
        elif op in ("pool_end", "capture_end") and len(w) >= 2:
            routes = {s: p for s, p in routes.items() if w[1] not in (p, s)}
        seeding = seeding and op in ("alloc", "stream")


def write_mask(path, rule, min_size, out):
    """Write the action indices of the requests over min_size that `rule` predicts long."""
    with open(out, "w", encoding="utf-8") as f:
        for req, _ in requests(path):
            if req.size > min_size and RULES[rule](req):
                f.write(f"{req.t}\n")


def score(path, life, min_size, rules):
    """{rule: [tp, fp, fn, tp bytes, fp bytes, fn bytes]} over the trace's requests over
    min_size, and (scored requests, long-lived requests, long-lived bytes)."""
    counts, scored, long_n, long_bytes = {r: [0] * 6 for r in rules}, 0, 0, 0
    stacks = False
    for req, t in requests(path):
        stacks = stacks or req.stack is not None
        if req.size <= min_size:
            continue
        is_long = t is None or (life is not None and t > life)
        scored += 1
        long_n += is_long
        long_bytes += req.size * is_long
        for r in rules:
            pred, c = RULES[r](req), counts[r]
            k = 0 if pred and is_long else 1 if pred else 2 if is_long else None
            if k is not None:
                c[k] += 1
                c[k + 3] += req.size
    if not stacks:
        counts.pop("stack-live", None)
    return counts, (scored, long_n, long_bytes)


def pct(a, b):
    return f"{100 * a / b:.1f}" if b else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="DIR")
    ap.add_argument("--life", type=int, help="long-lived: never freed or freed more than N "
                    "actions later (default: never freed)")
    ap.add_argument("--min-size", type=int, default=MIB, help="score requests over this (bytes)")
    ap.add_argument("--write-mask", nargs=2, metavar=("RULE", "FILE"),
                    help="write the action indices RULE predicts long to FILE (one trace only), "
                    "for XSEG_REPLAY_ORACLE=file:FILE; rules: " + ", ".join(RULES))
    args = ap.parse_args()
    if args.write_mask and args.write_mask[0] not in RULES:
        raise SystemExit(f"lifetime_probe.py: --write-mask: no rule {args.write_mask[0]!r} "
                         f"(rules: {', '.join(RULES)})")
    if args.life is not None and args.life < 0:
        raise SystemExit("lifetime_probe.py: --life must be 0 or more")
    traces = []
    for d in args.dirs:
        if not os.path.isdir(d):
            raise SystemExit(f"lifetime_probe.py: {d}: no such directory")
        found = sorted(os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs
                       if f.endswith(".trace"))
        if not found:
            raise SystemExit(f"lifetime_probe.py: {d}: no .trace files (convert snapshots with "
                             "tools/snapshot2trace.py --out-dir)")
        traces += [(os.path.relpath(t, d), t) for t in found]
    if args.write_mask:
        if len(traces) != 1:
            raise SystemExit(f"lifetime_probe.py: --write-mask: a mask is for one trace, "
                             f"found {len(traces)}")
        write_mask(traces[0][1], args.write_mask[0], args.min_size, args.write_mask[1])
    truth = "never freed" if args.life is None else f"freed after more than {args.life} actions"
    print(f"long-lived: {truth}; requests over {args.min_size:,} bytes; MiB = 2^20 bytes")
    print("| trace | large requests | long-lived (MiB) | rule | predicted long | precision % | "
          "recall % | long MiB predicted short | short MiB predicted long |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals = collections.defaultdict(lambda: [0] * 6)
    for name, path in traces:
        counts, (n, long_n, long_bytes) = score(path, args.life, args.min_size, list(RULES))
        head = f"| {name} | {n} | {long_n} ({long_bytes / MIB:,.0f}) |"
        for r, (tp, fp, fn, tpb, fpb, fnb) in counts.items():
            print(f"{head} {r} | {tp + fp} | {pct(tp, tp + fp)} | {pct(tp, tp + fn)} | "
                  f"{fnb / MIB:,.0f} | {fpb / MIB:,.0f} |")
            head = "| | | |"
            totals[r] = [a + b for a, b in zip(totals[r], (tp, fp, fn, tpb, fpb, fnb))]
    print(f"\nover all {len(traces)} traces (stack-live: those with frames)")
    print("| rule | predicted long | precision % (bytes %) | recall % (bytes %) | "
          "long MiB predicted short | short MiB predicted long |")
    print("|---|---|---|---|---|---|")
    for r, (tp, fp, fn, tpb, fpb, fnb) in totals.items():
        print(f"| {r} | {tp + fp} | {pct(tp, tp + fp)} ({pct(tpb, tpb + fpb)}) | "
              f"{pct(tp, tp + fn)} ({pct(tpb, tpb + fnb)}) | {fnb / MIB:,.0f} | {fpb / MIB:,.0f} |")


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"lifetime_probe.py: {e}")
