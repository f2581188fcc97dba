#!/usr/bin/env python3
"""Turn the summary of a GPU acceptance run (benchmarks/gpu/run.sh: RESULTS/summary.json) into
the markdown tables of docs/benchmarks.md's GPU sections, or (--features) docs/gpu.md's feature
table. Standard library only.

usage: tables.py RESULTS_DIR|summary.json              (the GPU tables, markdown on stdout)
       tables.py --features RESULTS_DIR|summary.json   (docs/gpu.md's feature table)

A run on the emulator (run.sh --emulator) is labelled so in every heading and cell: its figures
are cudaemu's, not a GPU's.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summary import STATUSES, consistent, split_test_name  # noqa: E402

GiB = float(1 << 30)


def load(arg):
    path = os.path.join(arg, "summary.json") if os.path.isdir(arg) else arg
    with open(path) as f:
        s = json.load(f)
    if "checks" not in s or "device" not in s:
        raise SystemExit("tables.py: %s is no summary.json of run.sh" % path)
    return normalize(s)


def test_item_name(name):
    """An item name with the test named as summary.py names it now: a summary of the first H200 run
    (its summary.py read meson 1.12's names as "test ?/alloc - xseg:ipc") gives "test alloc/ipc"."""
    row = re.match(r"^(row .*\()([^()]* - [^()]*)\)$", name)  # the test in the last parentheses
    if row:
        return "%s%s)" % (row.group(1), split_test_name(row.group(2))[1])
    m = re.match(r"^(test|case) (.*)$", name)
    if not m:
        return name
    kind, rest = m.groups()
    if kind == "test" and rest.startswith("?/"):
        suites, test = split_test_name(rest[2:])
        return "test %s/%s" % (suites[0] if suites else "?", test)
    if kind == "case" and " - " in rest.split("/")[0]:
        head, _, case = rest.partition("/")
        return "case %s/%s" % (split_test_name(head)[1], case)
    return name


def normalize(s):
    """Item names in today's form, per-suite counts from the items where the summary has none
    under a suite's name, and no check that says pass with a failed item (summary.consistent)."""
    for c in s["checks"]:
        for i in c.get("items", []):
            i["name"] = test_item_name(i["name"])
        for r in c.get("data", {}).get("conformance_rows") or []:
            r["test"] = split_test_name(r["test"])[1]
        per = c.get("data", {}).get("suites")
        if per is not None and "?" in per:
            per = {}
            for i in c["items"]:
                m = re.match(r"^test ([^/]+)/", i["name"])
                if m:
                    k = per.setdefault(m.group(1), {"pass": 0, "fail": 0, "skip": 0})
                    k[i["status"] if i["status"] in k else "fail"] += 1
            c["data"]["suites"] = per
    checks = []
    for c in s["checks"]:
        said = c["status"]
        c = consistent(c)
        failed = [i["name"] for i in c.get("items", []) if i["status"] == "fail"]
        if failed and c["reason"].split(" items failed: ")[0].count(" of ") == 1:  # the names, in today's form
            c["reason"] = "%d of %d items failed: %s%s%s" % (
                len(failed), len(c["items"]), ", ".join(failed[:5]), ", ..." if len(failed) > 5 else "",
                "" if said == "fail" else " (it said %s)" % said)
        checks.append(c)
    s["checks"] = checks
    s["counts"] = {st: sum(c["status"] == st for c in s["checks"]) for st in STATUSES}
    return s


def check(s, name):
    return next((c for c in s["checks"] if c["name"] == name), None)


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
    return ("### GPU acceptance run: %s, driver %s, torch %s, %s, commit %s%s\n\n"
            "Budget %d s, %.0f s used%s: %d pass, %d fail, %d skip, %d not reached." % (
                where, s["driver"], s["torch"], s["date"][:10], s["commit"], " (--quick)" if s["quick"] else "",
                s["budget"], s["seconds"], "; resumed from the run of %s" % s["resumed_from"]["date"]
                if s.get("resumed_from") else "", c["pass"], c["fail"], c["skip"], c["not-reached"]))


def overview(s):
    return table(["check", "result", "time", "detail"],
                 [(c["name"], c["status"].upper() if c["status"] == "fail" else c["status"],
                   "%.0f / %d s" % (c["seconds"], c["limit"]) if not c.get("previous") else "earlier run",
                   first_line(c["reason"]).replace("|", "\\|")) for c in s["checks"]])


def items_table(c, only=None):
    rows = [(i["name"].replace("|", "\\|"), i["status"].upper() if i["status"] == "fail" else i["status"],
             first_line(i["reason"]).replace("|", "\\|"))
            for i in (c or {}).get("items", []) if only is None or only(i)]
    return table(["item", "result", "detail"], rows) if rows else ""


def driver(s, c):
    out = []
    rows = c["data"].get("conformance_rows") or []
    if rows:
        bad = [r for r in rows if r["status"] == "fail"]
        out.append("Conformance rows (tests/driver): %d, %d agree with cudaemu, %d differ, %d skipped." % (
            len(rows), sum(r["status"] == "pass" for r in rows), len(bad), sum(r["status"] == "skip" for r in rows)))
        if bad:
            out.append("Rows where the driver differs from cudaemu (cudaemu bugs):\n\n" + table(
                ["test", "row", "driver / expected"], [(r["test"], r["table"] + ": " + r["row"], r["result"]) for r in bad]))
    ep = c["data"].get("entry_points")
    if ep:
        out.append("cudaemu exports %d entry points; %d are named by no conformance test (tests/driver), "
                   "so the driver's answers there are not compared: %s." % (
                       ep["exported"], len(ep["not_in_conformance_tests"]),
                       ", ".join("`%s`" % n for n in ep["not_in_conformance_tests"]) or "none"))
    other = items_table(c, lambda i: i["status"] != "pass" and not i["name"].startswith("row "))
    if other:
        out.append("Tests and cases of the driver suite that did not pass:\n\n" + other)
    return out


def suites(s, c):
    out = []
    per = c["data"].get("suites") or {}
    status = {i["name"][6:]: i for i in c["items"] if i["name"].startswith("suite ")}
    if status:
        out.append(table(["suite", "result", "pass", "fail", "skip", "detail"], [
            (k, i["status"].upper() if i["status"] == "fail" else i["status"], per.get(k, {}).get("pass", "-"),
             per.get(k, {}).get("fail", "-"), per.get(k, {}).get("skip", "-"), first_line(i["reason"]).replace("|", "\\|"))
            for k, i in status.items()]))
    other = items_table(c, lambda i: i["status"] not in ("pass",) and not i["name"].startswith("suite "))
    if other:
        out.append("Tests and cases that did not pass, skips with their reasons:\n\n" + other)
    return out


def torch_(s, c):
    return [items_table(c)]


def frag(s, c):
    out = []
    train = c["data"].get("training", [])
    if train:
        out.append("Training loop (train_transformer.py, %s steps):\n\n" % train[0].get("steps", "?") + table(
            ["allocator", "peak allocated", "peak reserved", "utilization", "step (median)", "ns per pair", "syncs"],
            [(r["mode"], gib(r["peak_allocated"]), gib(r["peak_reserved"]), "%.3f" % r["utilization"],
              "%.1f ms" % r["step_ms_median"], "%.0f" % r["pair_ns"], num(r.get("num_sync_all_streams"), "%d"))
             for r in train]))
    rows_in = c["data"].get("fragmentation", [])
    if rows_in:
        rows = []
        modes = ["native", "native-exp", "async", "xseg", "xseg-classic"]
        rows_in = sorted(rows_in, key=lambda r: (r.get("order", 0), r["trace"],
                                                 modes.index(r["mode"]) if r["mode"] in modes else len(modes)))
        for r in rows_in:
            f = r.get("min_fraction")
            rows.append((os.path.basename(r["trace"]).replace(".gz", "").replace(".trace", ""), r["mode"],
                         gib(r["peak_allocated_bytes"]), gib(r["peak_reserved_bytes"]), "%.3f" % r["utilization"],
                         "-" if not f else "%.4f (%s)" % (f, gib(r.get("min_fraction_bytes"))),
                         num(r.get("num_sync_all_streams"), "%d"), r.get("failed_allocs", 0)))
        out.append("Traces replayed through tensors (compare_pytorch.py%s):\n\n" % (
            ", fake backend" if s["emulator"] else "") + table(
            ["trace", "allocator", "peak allocated", "peak reserved", "utilization", "smallest fraction",
             "syncs", "failed allocs"], rows))
    other = items_table(c, lambda i: i["status"] != "pass")
    if other:
        out.append(other)
    return out


def services(s, c):
    out = []
    d = c["data"]
    dev = d.get("device")
    if dev:
        out.append("Devices: %d (%s); fabric handles: %s; peer access: %s." % (
            dev["device_count"], ", ".join(x["name"] for x in dev["devices"]),
            ", ".join("yes" if x["fabric"] else "no" for x in dev["devices"]) or "-",
            "; ".join("%d->%s" % (x["ordinal"], ",".join(map(str, x["peer"])) or "none") for x in dev["devices"])))
    sv = (d.get("services") or {}).get("sleep and wake")
    if sv:
        rows = []
        for m in ("offload", "discard"):
            for which in ("first", "kept"):
                v = (sv.get(m) or {}).get(which)
                if v:
                    rows.append(("%s, %s cycle" % (m, "first" if which == "first" else "later"), sv[m]["gib"],
                                 "%.1f ms" % (v["sleep_s"] * 1e3), "%.1f ms" % (v["wake_s"] * 1e3),
                                 "%.1f ms" % (v["first_kernel_s"] * 1e3),
                                 "%.1f (%.2fx)" % (v["sleep_gib_s"], v["sleep_x_pinned"]),
                                 "%.1f (%.2fx)" % (v["wake_gib_s"], v["wake_x_pinned"])))
        out.append("Sleep and wake through PyTorch (live tensors; pinned copy in the same call: %.1f GiB/s "
                   "device to host, %.1f host to device):\n\n" % (sv["pinned_dtoh_gib_s"], sv["pinned_htod_gib_s"])
                   + table(["mode", "GiB", "sleep", "wake", "wake's return to a kernel run",
                            "sleep GiB/s (x pinned)", "wake GiB/s (x pinned)"], rows))
    gv = (d.get("services") or {}).get("graph replayed after a tagged wake")
    if gv:
        out.append("A CUDA graph replayed bit-exact after a tagged sleep (level 1) and wake: sleep %.1f ms, wake "
                   "%.1f ms, replay %.2f ms." % (gv["sleep_s"] * 1e3, gv["wake_s"] * 1e3,
                                                 gv["replay_after_wake_s"] * 1e3))
    for t in d.get("bench_services") or []:
        if t:
            out.append(table(t[0], t[1:]))
    sb = d.get("sleep_batch")
    if sb:  # [bytes, runs, one call per run us, batched us] per run size (check_services.sh)
        out.append("Many small blocks: sleep + wake wall time per run size, one call per run against "
                   "cuMemcpyBatchAsync batches (bench_sleep_batch, median):\n\n" + table(
                       ["run size", "runs", "one call per run", "batched", "batched / one call"],
                       [["%d KiB" % (r[0] // 1024), r[1], "%.2f ms" % (r[2] / 1e3), "%.2f ms" % (r[3] / 1e3),
                         "%.2f" % (r[3] / r[2]) if r[2] else "-"] for r in sb]))
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
    out.append(items_table(c))
    return out


def probes(s, c):
    rows = []
    for i in c["items"]:
        d = (c["data"].get("probes") or {}).get(i["name"]) or {}
        answer = {"pass": "supported" if d.get("supported") else "not supported"}.get(i["status"], i["status"])
        if i["status"] == "fail":
            answer = "FAIL"
        rows.append((i["name"], answer, first_line(d.get("words") or i["reason"], 200).replace("|", "\\|")))
    return ["Probes (device_probe.py probes):\n\n" + table(["probe", "answer", "the driver's words"], rows)] if rows else []


SECTIONS = (("driver", driver), ("suites", suites), ("torch", torch_), ("services", services),
            ("probes", probes), ("frag", frag))


def gpu_tables(s):
    parts = [heading(s), overview(s)]
    for name, fn in SECTIONS:
        c = check(s, name)
        # A check its time cut short still shows what it measured (on the H200, 2026-11-27, frag
        # had every trace's figures and xseg's training row, and the tables showed none of them).
        if c and (c["status"] != "not-reached" or c.get("items")):
            body = [p for p in fn(s, c) if p]
            if body:
                parts.append("#### %s%s%s\n\n" % (name, " (earlier run)" if c.get("previous") else "",
                                                   " (cut short)" if c["status"] == "not-reached" else "")
                             + "\n\n".join(body))
    return "\n\n".join(parts)


# docs/gpu.md's feature table: each feature, the items of the summary that prove it (check name,
# item name prefix; None: the whole check), and the check(s) of run.sh that run it.
FEATURES = (
    ("core allocator: both segment kinds, seed-003 tables, `record_stream`, OOM, errors, pools and capture, "
     "statistics oracle, data fuzzer, threads", [("suites", "suite alloc")], "suites (`alloc`)"),
    ("VMM conformance rows (`driver-vmm`)", [("driver", "row "), ("driver", "test driver/driver-vmm")], "driver"),
    ("segment manager, driver loader", [("suites", "suite segment"), ("driver", "test driver/driver-loader")],
     "driver, suites (`segment`)"),
    ("host fast path, VMM call costs", [("services", "bench_vmm_costs"), ("services", "remap of a kept handle")],
     "services (VMM call costs, remap of a kept handle)"),
    ("fragmentation against PyTorch's allocators, training loop",
     [("frag", "train_transformer.py"), ("frag", "replay ")],
     "frag (three traces, smallest memory fraction, sync counts)"),
    ("`xseg-replay` on the driver", [("suites", "suite replay")], "suites (`replay`)"),
    ("services: trim, release threshold, idle reclaim", [("suites", "suite services"), ("services", "trim")],
     "suites (`services`), services (trim through PyTorch)"),
    ("sleep and wake (offload, discard, a graph's pool, by tag)",
     [("services", "sleep and wake"), ("services", "graph replayed after a tagged wake"),
      ("services", "sleep and wake at the link's speed")],
     "services (GiB/s beside the pinned copy, time to a kernel, graph replay after a tagged wake), "
     "suites (`services`: test_sleep_tags)"),
    ("IPC, fabric handles, segment observers, block handles", [("services", "ipc ")],
     "services (`test_ipc main`; fabric where reported), suites (`alloc`)"),
    ("peer access", [("services", "peer access")], "services, with two GPUs"),
    ("allocation history and snapshots", [("suites", "suite history"), ("torch", "torch.cuda.memory._dump_snapshot")],
     "suites (`history`), torch (`_dump_snapshot`, then memory-viz here)"),
    ("capture reuse (`graph_capture_record_stream_reuse`) with graph launches",
     [("suites", "suite alloc"), ("torch", "torch.cuda.graph"), ("torch", "torch.compile")],
     "suites (`alloc`), torch (`torch.cuda.graph`, `torch.compile` reduce-overhead)"),
    ("the defragmenting OOM path", [("suites", "suite alloc")], "suites (`alloc`)"),
    ("Python package", [("suites", "suite python")], "suites (`python`)"),
    ("PyTorch adapter (`xseg.torch.enable()`)",
     [("torch", "xseg.torch.enable"), ("torch", "torch.cuda.MemPool"), ("torch", "record_stream"),
      ("torch", "stats, summary"), ("torch", "pytest ")], "torch"),
    ("spill to host: only declared tensors move; kernels on a side stream write spilled, undeclared and taken-back "
     "tensors while another thread promotes", [("services", "spill contract")], "services (spill contract)"),
    ("host-located VMM memory read and written by a kernel", [("probes", "host-located")], "probes"),
    ("one physical handle mapped at many addresses", [("probes", "one physical handle")], "probes"),
    ("dma-buf export (`cuMemGetHandleForAddressRange`)", [("probes", "dma-buf")], "probes"),
)


def feature_cell(s, proofs):
    """What the summary says of a feature: yes (all its items passed), the first failure, not
    reached, or skipped with the reason; probes answer supported / not supported."""
    found = []
    for name, prefix in proofs:
        c = check(s, name)
        if c is None:
            found.append(("not-reached", "no `%s` check in this run" % name, None))
        elif prefix is None:
            found.append((c["status"], c["reason"], c))
        else:
            items = [i for i in c["items"] if i["name"].startswith(prefix)]
            if not items:
                found.append(("not-reached" if c["status"] in ("not-reached", "fail") else "skip",
                              c["reason"] if c["status"] != "pass" else "not run", c))
            for i in items:
                d = (c["data"].get("probes") or {}).get(i["name"]) if name == "probes" else None
                found.append((i["status"], (("supported" if d["supported"] else "not supported: " + d["words"])
                                            if d else i["reason"]), c))
    where = "cudaemu dry run, not a GPU" if s["emulator"] else "%s, %s" % (s["device"].split(";")[0], s["date"][:10])
    for status, label in (("fail", "**failed**"), ("not-reached", "not reached"), ("skip", "skipped")):
        bad = [f for f in found if f[0] == status]
        if bad:
            return "%s (%s): %s" % (label, where, first_line(bad[0][1], 100).replace("|", "\\|"))
    probe = [f[1] for f in found if f[1].startswith(("supported", "not supported"))]
    if probe:
        return "%s (%s)" % (first_line(probe[0], 120).replace("|", "\\|"), where)
    return "yes, %s" % where


def features(s):
    return table(["feature", "on a real GPU", "check of run.sh"],
                 [(f, feature_cell(s, proofs), checks) for f, proofs, checks in FEATURES])


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--features" and len(argv) == 2:
        print(features(load(argv[1])))
    elif len(argv) == 1:
        print(gpu_tables(load(argv[0])))
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
