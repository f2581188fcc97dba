#!/usr/bin/env python3
"""Turn the summaries of a GPU acceptance run (benchmarks/gpu/run.sh: RESULTS/stageN.json) into
the markdown tables of docs/benchmarks.md's GPU sections. Standard library only.

usage: tables.py RESULTS_DIR | stageN.json...    (markdown on stdout)

A run on the emulator (run.sh --emulator) is labelled so in every heading: its figures are
cudaemu's, not a GPU's.
"""
import json
import os
import sys

GiB = float(1 << 30)


def load(args):
    paths = []
    for a in args:
        if os.path.isdir(a):
            paths += sorted(os.path.join(a, f) for f in os.listdir(a) if f.startswith("stage") and f.endswith(".json"))
        else:
            paths.append(a)
    stages = {}
    for p in paths:
        with open(p) as f:
            s = json.load(f)
        stages[s["stage"]] = s
    return stages


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def first_line(text, n=120):
    text = (text or "").strip()
    line = text.splitlines()[-1] if text else ""
    return (line[:n] + "…") if len(line) > n else line


def gib(x):
    return "-" if x is None else "%.3f GiB" % (x / GiB)


def num(x, fmt="%.1f"):
    return "-" if x is None else fmt % x


def heading(s):
    where = "cudaemu, emulator dry run: not GPU figures" if s["emulator"] else s["device"]
    c = s["counts"]
    return "### Stage %d (%s): %s, %s, commit %s%s\n\n%d pass, %d fail, %d skip%s." % (
        s["stage"], s["name"], where, s["date"][:10], s["commit"], " (--quick)" if s["quick"] else "",
        c["pass"], c["fail"], c["skip"], "" if s["complete"] else "; the stage ran out of time")


def checks_table(s, only=None):
    rows = [(c["name"], c["status"].upper() if c["status"] == "fail" else c["status"],
             first_line(c["reason"]).replace("|", "\\|"))
            for c in s["checks"] if only is None or only(c)]
    return table(["check", "result", "detail"], rows) if rows else ""


def stage1(s):
    out = [heading(s)]
    suites = s["data"].get("suites", {})
    if suites:
        out.append(table(["suite", "pass", "fail", "skip"],
                         [(k, v["pass"], v["fail"], v["skip"]) for k, v in sorted(suites.items())]))
    rows = s["data"].get("conformance_rows", [])
    if rows:
        bad = [r for r in rows if r["status"] == "fail"]
        out.append("Conformance rows (tests/driver): %d, %d agree with cudaemu, %d differ, %d skipped." % (
            len(rows), sum(r["status"] == "pass" for r in rows), len(bad), sum(r["status"] == "skip" for r in rows)))
        if bad:
            out.append("Rows where the driver differs from cudaemu (cudaemu bugs):\n\n" + table(
                ["test", "row", "driver / expected"], [(r["test"], r["table"] + ": " + r["row"], r["result"]) for r in bad]))
    ep = s["data"].get("entry_points")
    if ep:
        out.append("cudaemu exports %d entry points; %d are named by no conformance test (tests/driver/test_vmm.c), "
                   "so the driver's answers there are not compared: %s." % (
                       ep["exported"], len(ep["not_in_conformance_tests"]),
                       ", ".join("`%s`" % n for n in ep["not_in_conformance_tests"]) or "none"))
    other = checks_table(s, lambda c: c["status"] != "pass" and not c["name"].startswith("row "))
    if other:
        out.append("Tests and cases that did not pass, skips with their reasons:\n\n" + other)
    return out


def stage2(s):
    return [heading(s), checks_table(s)]


def stage3(s):
    out = [heading(s)]
    train = s["data"].get("training", [])
    if train:
        out.append("Training loop (train_transformer.py, %s steps):\n\n" % train[0].get("steps", "?") + table(
            ["allocator", "peak allocated", "peak reserved", "utilization", "step (median)", "ns per pair", "syncs"],
            [(r["mode"], gib(r["peak_allocated"]), gib(r["peak_reserved"]), "%.3f" % r["utilization"],
              "%.1f ms" % r["step_ms_median"], "%.0f" % r["pair_ns"], num(r.get("num_sync_all_streams"), "%d"))
             for r in train]))
    frag = s["data"].get("fragmentation", [])
    if frag:
        rows = []
        modes = ["native", "native-exp", "async", "xseg", "xseg-classic"]
        frag = sorted(frag, key=lambda r: (r.get("order", 0), r["trace"],
                                           modes.index(r["mode"]) if r["mode"] in modes else len(modes)))
        for r in frag:
            f = r.get("min_fraction")
            rows.append((os.path.basename(r["trace"]).replace(".gz", "").replace(".trace", ""), r["mode"],
                         gib(r["peak_allocated_bytes"]), gib(r["peak_reserved_bytes"]), "%.3f" % r["utilization"],
                         "-" if not f else "%.4f (%s)" % (f, gib(r.get("min_fraction_bytes"))),
                         num(r.get("num_sync_all_streams"), "%d"), r.get("failed_allocs", 0)))
        out.append("Traces replayed through tensors (compare_pytorch.py%s):\n\n" % (
            ", fake backend" if s["emulator"] else "") + table(
            ["trace", "allocator", "peak allocated", "peak reserved", "utilization", "smallest fraction",
             "syncs", "failed allocs"], rows))
    other = checks_table(s, lambda c: c["status"] != "pass")
    if other:
        out.append(other)
    return out


def stage4(s):
    out = [heading(s)]
    d = s["data"]
    dev = d.get("device")
    if dev:
        out.append("Devices: %d (%s); fabric handles: %s; peer access: %s." % (
            dev["device_count"], ", ".join(x["name"] for x in dev["devices"]),
            ", ".join("yes" if x["fabric"] else "no" for x in dev["devices"]) or "-",
            "; ".join("%d->%s" % (x["ordinal"], ",".join(map(str, x["peer"])) or "none") for x in dev["devices"])))
    sv = (d.get("services") or {}).get("sleep and wake")
    if sv:
        out.append("Sleep and wake through PyTorch (live tensors):\n\n" + table(
            ["mode", "GiB", "sleep", "wake", "until a kernel ran", "sleep GiB/s", "wake GiB/s"],
            [(m, v["gib"], "%.1f ms" % (v["sleep_s"] * 1e3), "%.1f ms" % (v["wake_s"] * 1e3),
              "%.1f ms" % (v["resume_s"] * 1e3), "%.1f" % v["sleep_gib_s"], "%.1f" % v["wake_gib_s"])
             for m, v in sv.items()]))
    for t in d.get("bench_services") or []:
        if t:
            out.append(table(t[0], t[1:]))
    vc = d.get("vmm_costs")
    if vc:
        ops = []
        for r in vc:
            if r["op"] not in ops:
                ops.append(r["op"])
        pages = sorted({int(r["page_mib"]) for r in vc})
        cell = {(int(r["page_mib"]), r["op"]): float(r["median_us"]) for r in vc}
        out.append("VMM call costs (bench_vmm_costs, median µs):\n\n" + table(
            ["page"] + ops, [["%d MiB" % p] + [num(cell.get((p, o))) for o in ops] for p in pages]))
    rm = d.get("remap")
    if rm:
        ops = []
        for r in rm["rows"]:
            if r["op"] not in ops:
                ops.append(r["op"])
        pages = sorted({r["page_mib"] for r in rm["rows"]})
        cell = {(r["page_mib"], r["op"]): r["median_us"] for r in rm["rows"]}
        out.append("Remap of a kept handle (device_probe.py remap, median µs):\n\n" + table(
            ["page"] + ops, [["%d MiB" % p] + [num(cell.get((p, o))) for o in ops] for p in pages]))
    out.append(checks_table(s))
    return out


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv else 2
    stages = load(argv)
    if not stages:
        print("tables.py: no stageN.json in %s" % " ".join(argv), file=sys.stderr)
        return 1
    parts = []
    for n, fn in ((1, stage1), (2, stage2), (3, stage3), (4, stage4)):
        if n in stages:
            parts += [p for p in fn(stages[n]) if p]
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
