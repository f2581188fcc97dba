#!/usr/bin/env python3
"""The README's figures match the records they cite (issue 78: "20 of 20 within 1 %" against a
linked page's "21 of 22" went unnoticed). Each figure is recomputed from its record, not copied:

- "N of M recorded device traces (and the K bundled synthetic workloads) fit on a device of peak
  allocated + 1 % (TRACE has one failed allocation there), classic mode C of the M (A of all T)":
  from docs/benchmarks-replay.md's fit table (its `table:fit` block): per section, the rows whose
  "failed allocations at 1.01 × peak" is 0, recorded traces apart from the builtin: workloads.
- "Over every trace of the fit harness (N, ...), K fit at peak allocated + 1 %; A and B need R ×
  (RA and RB, still below PyTorch's expandable layout)": from the harness block (`table:fit-harness`):
  its last goals line ("after: K of N fit at 1.01 x peak allocated (not: A, B)") and each named
  trace's "after: fits from" ratio, which R must give to two decimals, and its layout column
  (a larger ratio, or "above" the band).
- "sleep and wake move X GiB/s, R of the pinned copy" and "all N PyTorch items pass": docs/gpu.md,
  which tables.py writes from the raw outputs, must state the same X, R and "N items passed".

Usage: readme_figures.py ROOT. Exits 1 naming each figure that disagrees."""
import re
import sys

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def fit_sections(text):
    """{section title ("default", "classic", ...): {workload: failed allocations}} of the fit table."""
    m = re.search(r"<!-- table:fit begin:.*?-->(.*?)<!-- table:fit end -->", text, re.S)
    if not m:
        raise SystemExit("readme_figures: docs/benchmarks-replay.md has no table:fit block")
    out, cur = {}, None
    for line in m.group(1).splitlines():
        h = re.match(r"^([A-Za-z][^|(]*?) \(`[^`]*`\)\s*$", line)
        if h:
            cur = h.group(1).strip()
            out[cur] = {}
            continue
        r = re.match(r"^\| ([^|]+?) \| [\d,.]+ \| (\d+) \|", line)
        if r and cur:
            out[cur][r.group(1)] = int(r.group(2))
    return out


def harness_sentence(flat, page):
    """The README's sentence on every trace of the fit harness against the harness block."""
    m = re.search(r"Over every trace of the fit harness \((\d+), [^)]*\), (\d+) fit at peak allocated \+ 1 %; "
                  r"(\S+) and (\S+) need ([\d.]+) × \(([\d.]+) and ([\d.]+), still below PyTorch's expandable layout\)",
                  flat)
    if not m:
        return ["README: the fit harness sentence (\"Over every trace of the fit harness ...\") is not found in its form"]
    n, k, a, b, r, ra, rb = m.groups()
    blk = re.search(r"<!-- table:fit-harness begin:.*?-->(.*?)<!-- table:fit-harness end -->", page, re.S)
    if not blk:
        return ["docs/benchmarks-replay.md has no table:fit-harness block"]
    goals = re.findall(r"goals, every trace shown: after: (\d+) of (\d+) fit at 1.01 x peak allocated \(not: ([^)]*)\)",
                       blk.group(1))
    if not goals:
        return ["docs/benchmarks-replay.md: the fit harness block has no goals line of its 'after' side"]
    gk, gn, gnot = goals[-1]
    bad = []
    if (k, n) != (gk, gn):
        bad.append("README says %s of %s fit at 1.01 x; the fit harness says %s of %s" % (k, n, gk, gn))
    if sorted([a, b]) != sorted(x.strip() for x in gnot.split(",")):
        bad.append("README names %s and %s as not fitting at 1.01 x; the fit harness names %s" % (a, b, gnot))
    for name, said in ((a, ra), (b, rb)):
        row = re.search(r"^\| [^|]+ \| %s \| [^|]+ \| [^|]+ \| [^|]+ \| [^|]+ \| [^|]*\(([\d.]+)\) \| [^|]+ \| "
                        r"[^|]+ \| ([^|]+) \|" % re.escape(name), blk.group(1), re.M)
        if not row:
            bad.append("the fit harness table has no row for %s" % name)
            continue
        got, layout = row.group(1), row.group(2).strip()
        if said != got:
            bad.append("README says %s fits from %s x; the fit harness says %s" % (name, said, got))
        if abs(float(r) - float(got)) >= 0.005:
            bad.append("README's %s x is not %s's %s to two decimals" % (r, name, got))
        lr = re.search(r"\(([\d.]+)\)", layout)
        if not (layout == "above" or (lr and float(lr.group(1)) > float(got))):
            bad.append("README says %s fits below PyTorch's expandable layout; the layout column says %s" % (name, layout))
    return bad


def main(root):
    readme = open(root + "/README.md", encoding="utf-8").read()
    flat = " ".join(readme.split())
    bad = []
    secs = fit_sections(open(root + "/docs/benchmarks-replay.md", encoding="utf-8").read())

    m = re.search(r"(\d+) of (\d+) recorded device traces \(and the (\d+) bundled synthetic workloads\) fit on a "
                  r"device of peak allocated \+ 1 % \((\S+) has (\w+) failed allocations? there\), classic mode (\d+) "
                  r"of the (\d+) \((\d+) of all (\d+)\)", flat)
    if not m:
        bad.append("README: the fit sentence (\"N of M recorded device traces ...\") is not found in its form")
    else:
        n, tot, nb, trace, fails, c, ctot, call, alltot = m.groups()
        for name, rows in (("default", secs.get("default")), ("classic", secs.get("classic"))):
            if not rows:
                bad.append("docs/benchmarks-replay.md: no %s section in the fit table" % name)
        d, cl = secs.get("default", {}), secs.get("classic", {})
        rec = [w for w in d if not w.startswith("builtin:")]
        got = {
            "recorded traces (M)": (int(tot), len(rec)),
            "recorded traces that fit (N)": (int(n), sum(1 for w in rec if d[w] == 0)),
            "bundled workloads (K)": (int(nb), sum(1 for w in d if w.startswith("builtin:"))),
            "classic: recorded traces that fit (C)": (int(c), sum(1 for w in cl if not w.startswith("builtin:")
                                                                  and cl[w] == 0)),
            "classic: recorded traces (the M after it)": (int(ctot), sum(1 for w in cl if not w.startswith("builtin:"))),
            "classic: all workloads that fit (A)": (int(call), sum(1 for w in cl if cl[w] == 0)),
            "classic: all workloads (T)": (int(alltot), len(cl)),
            "the failed allocations of %s" % trace: (WORDS.get(fails, -1) if not fails.isdigit() else int(fails),
                                                     d.get(trace, -1)),
        }
        for what, (said, rec_v) in got.items():
            if said != rec_v:
                bad.append("README says %s for %s; docs/benchmarks-replay.md's fit table gives %s" % (said, what, rec_v))

    bad += harness_sentence(flat, open(root + "/docs/benchmarks-replay.md", encoding="utf-8").read())

    gpu = " ".join(open(root + "/docs/gpu.md", encoding="utf-8").read().split())
    m = re.search(r"sleep and wake move ([\d.]+) GiB/s, ([\d.]+) of the pinned copy", flat)
    if not m:
        bad.append("README: the sleep and wake figure (\"sleep and wake move X GiB/s, R of the pinned copy\") is not found")
    else:
        if "at %s GiB/s" % m.group(1) not in gpu:
            bad.append("README says sleep and wake move %s GiB/s; docs/gpu.md does not" % m.group(1))
        if "%s of the pinned copy" % m.group(2) not in gpu and "**%s of" % m.group(2) not in gpu:
            bad.append("README says %s of the pinned copy; docs/gpu.md does not" % m.group(2))
    m = re.search(r"all (\d+) PyTorch items pass", flat)
    if not m:
        bad.append("README: \"all N PyTorch items pass\" is not found")
    elif "| %s items passed, 0 skipped |" % m.group(1) not in gpu:
        bad.append("README says all %s PyTorch items pass; docs/gpu.md's run table does not" % m.group(1))

    for b in bad:
        print("readme_figures: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
