#!/usr/bin/env python3
"""The summary of the GPU acceptance run (benchmarks/gpu/run.sh), standard library only.

A check's script (check_NAME.sh) records items in its work folder:
  summary.py check WORK NAME pass|fail|skip|not-reached [REASON...]   one item of the check
  summary.py data WORK KEY FILE.json                      a JSON value kept as data[KEY]
  summary.py lines WORK FILE KEY                          JSON lines {name, status, reason, data}
                                                          (torch_checks.py, device_probe.py
                                                          probes): one item each, data[KEY][name]
  summary.py junit WORK FILE.xml PREFIX                   pytest's JUnit XML: one item per test
  summary.py rows-cover WORK LIBCUDAEMU TEST.c...         which of cudaemu's exported entry points
                                                          no conformance test names (data)
  summary.py tests WORK TESTLOG.json                      meson's test log: one item per test,
                                                          one per conformance row (tests/driver)
  summary.py list-tests LIST.txt SUITE|*                  the tests of SUITE (of any: *) in
                                                          `meson test --list`'s output, one a line
run.sh turns each check into one line of the summary:
  summary.py finish-check RUN NAME WORK RC LIMIT SECONDS  RUN/checks.jsonl gets the check's line
  summary.py not-reached RUN NAME REASON...               a check that did not start
  summary.py todo PREVIOUS.json                           the checks a --resume runs (failed or
                                                          not reached), one name a line
  summary.py item-status PREVIOUS.json CHECK ITEM         an item's status in a previous summary
  summary.py write RUN OUT BUDGET [PREVIOUS.json]         OUT/summary.json; prints a digest;
                                                          exits 1 when a check failed

summary.json: {"device", "driver", "torch", "commit", "date", "budget", "seconds", "emulator",
"quick", "resumed_from", "counts": {status: n}, "checks": [{"name", "status", "reason", "seconds",
"limit", "items": [{"name", "status", "reason"}], "data": {...}, "previous": DATE where a --resume
kept it from the summary of DATE}]}; a check's status is fail when
one of its items failed or it ran out of its time, not-reached when it did not start (or left
items not reached), skip when it only skipped, else pass (a check a --resume kept from an earlier
summary too: one with a failed item is never printed or kept as a pass).

meson names a test two ways in `--list` and its JSON log: before 1.12 `PROJECT:SUITE / TEST`
(`xseg:alloc / ipc`, several suites joined by `+`), from 1.12 `SUITE - PROJECT:TEST`
(`alloc - xseg:ipc`); split_test_name reads both.
"""
import datetime
import json
import os
import re
import subprocess
import sys

STATUSES = ("pass", "fail", "skip", "not-reached")


def add_check(work, name, status, reason=""):
    if status not in STATUSES:
        raise SystemExit("summary.py: status must be one of %s, not %r" % (STATUSES, status))
    with open(os.path.join(work, "checks.jsonl"), "a") as f:
        f.write(json.dumps({"name": name, "status": status, "reason": reason}) + "\n")


def git_commit(root):
    """The commit the run tested: $XSEG_GPU_COMMIT when the caller names it (the device tool sends
    the working tree, whose .git may still point at an older commit: the H200's second run of
    2026-11-26 reported bb71d80 for a later tree), else HEAD, marked "+changes" where tracked files
    differ from it."""
    named = os.environ.get("XSEG_GPU_COMMIT", "").strip()
    if named:
        return named
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        if not head:
            return "unknown"
        dirty = subprocess.run(["git", "-C", root, "diff", "--quiet", "HEAD", "--"], capture_output=True,
                               timeout=30).returncode
        return head + ("+changes" if dirty == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_and_driver(emulator, run):
    """The device's name and the driver (nvidia-smi, else device_probe.py info's RUN/device.json)."""
    if emulator:
        return "cudaemu (emulator dry run)", "cudaemu"
    info = read_json(os.path.join(run, "device.json")) or {}
    ver = info.get("driver_version")
    cuda = "CUDA %d.%d" % (ver // 1000, ver % 1000 // 10) if isinstance(ver, int) else None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        rows = [[c.strip() for c in l.split(",")] for l in r.stdout.splitlines() if l.strip()]
        if rows:
            return "; ".join(r[0] for r in rows), ", ".join(filter(None, [rows[0][-1], cuda]))
    except (OSError, subprocess.SubprocessError):
        pass
    names = [d["name"] for d in info.get("devices", [])]
    return ("; ".join(names) or "unknown (nvidia-smi and device_probe.py failed)"), cuda or "unknown"


def torch_version():
    """PyTorch's version from its metadata (importing torch would cost seconds of the budget)."""
    try:
        from importlib import metadata
        return metadata.version("torch")
    except Exception as e:  # not installed, or broken metadata: the reason is the answer
        return "none (%s)" % type(e).__name__


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def status_of(items, rc, limit):
    """A check's status and reason from its items and its script's exit status."""
    n = {s: sum(i["status"] == s for i in items) for s in STATUSES}
    failed = [i["name"] for i in items if i["status"] == "fail"]
    if rc in (124, 137):
        return "fail", "stopped at its limit of %s s; %d items ran before (%s failed)%s" % (
            limit, len(items), len(failed), ": " + ", ".join(failed[:5]) if failed else "")
    if failed:
        return "fail", "%d of %d items failed: %s" % (len(failed), len(items), ", ".join(failed[:5]) +
                                                     (", ..." if len(failed) > 5 else ""))
    if rc != 0:
        return "fail", "its script exited %s (see its log in logs.tgz)" % rc
    if n["not-reached"]:
        late = [i["name"] for i in items if i["status"] == "not-reached"]
        return "not-reached", "%d items passed, %d not reached in its time: %s" % (
            n["pass"], len(late), ", ".join(late[:8]) + (", ..." if len(late) > 8 else ""))
    if not items:
        return "fail", "it recorded nothing"
    if not n["pass"]:
        return "skip", items[0]["reason"] or "every item skipped"
    return "pass", "%d items passed, %d skipped" % (n["pass"], n["skip"])


def finish_check(run, name, work, rc, limit, seconds):
    items = read_lines(os.path.join(work, "checks.jsonl"))
    data = {}
    ddir = os.path.join(work, "data")
    if os.path.isdir(ddir):
        for fn in sorted(os.listdir(ddir)):
            data[fn[:-5]] = read_json(os.path.join(ddir, fn))
    status, reason = status_of(items, int(rc), limit)
    line = {"name": name, "status": status, "reason": reason, "seconds": round(float(seconds), 1),
            "limit": int(limit), "items": items, "data": data}
    with open(os.path.join(run, "checks.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
    return line


def not_reached(run, name, reason):
    with open(os.path.join(run, "checks.jsonl"), "a") as f:
        f.write(json.dumps({"name": name, "status": "not-reached", "reason": reason, "seconds": 0,
                            "limit": 0, "items": [], "data": {}}) + "\n")


def load_summary(path):
    """A previous summary.json (--resume), checked before it is trusted: a list of checks, each
    with a name, a known status and a list of items of the same shape."""
    s = read_json(path)

    def line_ok(x):
        return (isinstance(x, dict) and isinstance(x.get("name"), str) and x.get("status") in STATUSES and
                isinstance(x.get("reason", ""), str))
    if not (isinstance(s, dict) and isinstance(s.get("checks"), list) and all(
            line_ok(c) and isinstance(c.get("items", []), list) and all(line_ok(i) for i in c.get("items", []))
            and isinstance(c.get("data", {}), dict) and isinstance(c.get("seconds", 0), (int, float))
            for c in s["checks"])):
        raise SystemExit("summary.py: %s is no summary.json of run.sh" % path)
    return s


def todo(previous):
    s = load_summary(previous)
    for c in s["checks"]:
        if consistent(c)["status"] in ("fail", "not-reached"):
            print(c["name"])


def item_status(previous, check, item):
    for c in load_summary(previous)["checks"]:
        if c["name"] == check:
            for i in c.get("items", []):
                if i["name"] == item:
                    print(i["status"])
                    return


def merge(prev, new):
    """A check run again on --resume: the items of the previous line it did not run again and
    that passed or skipped (the suites it left alone) are kept, marked as such."""
    names = {i["name"] for i in new["items"]}
    kept = [dict(i, reason=(i["reason"] + " (previous run)").strip()) for i in prev.get("items", [])
            if i["name"] not in names and i["status"] in ("pass", "skip")]
    if not kept:
        return new
    items = kept + new["items"]
    status, reason = status_of(items, 0, new["limit"])
    if new["status"] == "fail":
        status, reason = new["status"], new["reason"]
    return dict(new, items=items, status=status, reason=reason)


def consistent(c):
    """A check whose items failed is failed, whatever its line says (a summary edited by hand, or
    one of an older run.sh, once printed PASS for "2 of 105 items failed")."""
    failed = [i["name"] for i in c.get("items", []) if i["status"] == "fail"]
    if not failed or c["status"] == "fail":
        return c
    return dict(c, status="fail", reason="%d of %d items failed: %s%s (it said %s)" % (
        len(failed), len(c["items"]), ", ".join(failed[:5]), ", ..." if len(failed) > 5 else "", c["status"]))


def write(run, out, budget, previous=None):
    checks = read_lines(os.path.join(run, "checks.jsonl"))
    prev = load_summary(previous) if previous else None
    if prev:
        now = {c["name"]: c for c in checks}
        merged = []
        for c in prev["checks"]:
            if c["name"] in now:
                merged.append(merge(c, now.pop(c["name"])))
            else:
                merged.append(dict(c, previous=prev.get("date", "?")))
        checks = merged + list(now.values())
    checks = [consistent(c) for c in checks]
    emulator = os.environ.get("XSEG_GPU_EMULATOR") == "1"
    device, driver = device_and_driver(emulator, run)
    summary = {
        "device": device, "driver": driver, "torch": torch_version(),
        "commit": git_commit(os.environ.get("XSEG_GPU_ROOT", ".")),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "budget": int(budget), "seconds": round(sum(c["seconds"] for c in checks if not c.get("previous")), 1),
        "emulator": emulator, "quick": os.environ.get("XSEG_GPU_QUICK") == "1",
        "resumed_from": {"date": prev.get("date"), "commit": prev.get("commit")} if prev else None,
        "device_info": read_json(os.path.join(run, "device.json")),
        "counts": {s: sum(c["status"] == s for c in checks) for s in STATUSES},
        "checks": checks,
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("run.sh on %s (driver %s, torch %s, commit %s), budget %d s:" % (
        device, driver, summary["torch"], summary["commit"], int(budget)))
    for c in checks:
        print("  %-11s %-8s %6.1f s  %s%s" % (c["status"].upper(), c["name"], c["seconds"],
                                              "(previous run) " if c.get("previous") else "",
                                              c["reason"].strip().splitlines()[0][:150] if c["reason"].strip() else ""))
    return 1 if summary["counts"]["fail"] else 0


ROW = re.compile(r"^(misuse|capture|graph|exec|probe): (.*?)\s+(?:-> (.*)|skipped \((.*)\))$")


OLD_NAME = re.compile(r"^(?P<project>[^:\s]+):(?P<suites>\S+) / (?P<test>.+)$")
NEW_NAME = re.compile(r"^(?P<suites>\S+) - (?P<project>[^:\s]+):(?P<test>.+)$")


def split_test_name(name):
    """(suites, test) of a meson test name in either form; ([], name) for a bare name."""
    name = name.strip()
    m = OLD_NAME.match(name) or NEW_NAME.match(name)
    if not m:
        return [], name
    return m.group("suites").split("+"), m.group("test").strip()


def list_tests(path, suite):
    """The names of SUITE's tests (every suite's: "*") in `meson test --list` output, in its
    order."""
    try:
        with open(path) as f:
            for line in f:
                suites, test = split_test_name(line)
                if suite in suites or (suite == "*" and suites):
                    print(test)
        sys.stdout.flush()
    except BrokenPipeError:
        # `| head -1` (check_suites.sh asks whether any line reads) closes the pipe early: an
        # answer, not an error (on the H200 it left a traceback in the suites check's log).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def rows_of(stdout):
    """The conformance rows a tests/driver test printed: (table, what, status, detail)."""
    for line in stdout.splitlines():
        m = ROW.match(line.strip())
        if not m:
            continue
        table, what, got, skipped = m.groups()
        if skipped is not None:
            yield table, what, "skip", skipped
        elif "expected" in got:
            yield table, what, "fail", got
        else:
            yield table, what, "pass", got


def tests(work, testlog):
    """One check per meson test (meson's JSON test log, one object per line) and per row."""
    # INTERRUPT: meson itself was stopped (the check's time ran out while the test ran; on the
    # H200, 2026-11-27, fit_harness after 6 s): not reached, so --resume runs its suite again. A
    # test stopped by its own limit is a TIMEOUT (test_limit.py) and fails.
    results = {"OK": "pass", "EXPECTEDFAIL": "pass", "SKIP": "skip", "INTERRUPT": "not-reached"}
    per_suite = {}
    rows = []
    with open(testlog) as f:
        for line in f:
            if not line.strip():
                continue
            t = json.loads(line)
            suites, test = split_test_name(t.get("name", "?"))
            suite = suites[0] if suites else "?"
            status = results.get(t.get("result"), "fail")
            out = t.get("stdout") or ""
            err = t.get("stderr") or ""
            reason = "%s in %.1f s" % (t.get("result"), t.get("duration", 0))
            limit = [l for l in (out + "\n" + err).splitlines() if l.startswith("test_limit.py: timed out")]
            if limit:
                reason = "TIMEOUT: " + limit[-1][len("test_limit.py: "):]
            if status == "fail":
                reason += "\n" + out[-2000:] + ("\n" + err[-1000:] if err.strip() else "")
            elif status == "skip":
                skips = [l for l in out.splitlines() if "SKIP" in l.upper()]
                reason += ": " + (skips[-1].strip() if skips else "exit status 77")
            add_check(work, "test %s/%s" % (suite, test), status, reason)
            if status == "not-reached":
                reason = "stopped when the check's time ran out, after %.1f s" % t.get("duration", 0)
            s = per_suite.setdefault(suite, {"pass": 0, "fail": 0, "skip": 0, "not-reached": 0})
            s[status] += 1
            # cmocka cases a passing binary skipped (emulator-only checks on the driver, or the reverse)
            for m in re.finditer(r"^\[  SKIPPED \] (\S+)$", out, re.M):
                why = [l for l in out[:m.start()].splitlines()[-3:] if "skip" in l.lower()]
                add_check(work, "case %s/%s" % (test, m.group(1)), "skip",
                          why[-1].replace("[  SKIPPED ]", "").strip() if why else "skipped by the test")
            for table, what, st, detail in rows_of(out):
                add_check(work, "row %s: %s (%s)" % (table, what, test), st, detail)
                rows.append({"test": test, "table": table, "row": what, "status": st,
                             "result": detail})
    # Added to what earlier calls on this work folder stored (the suites check: once per suite).
    before = read_json(os.path.join(work, "data", "suites.json")) or {}
    before.update(per_suite)
    store(work, "suites", before)
    if rows or os.path.exists(os.path.join(work, "data", "conformance_rows.json")):
        store(work, "conformance_rows", (read_json(os.path.join(work, "data", "conformance_rows.json")) or []) + rows)


def store(work, key, value):
    os.makedirs(os.path.join(work, "data"), exist_ok=True)
    with open(os.path.join(work, "data", key + ".json"), "w") as f:
        json.dump(value, f)


def lines(work, path, key):
    """torch_checks.py / compare_pytorch.py output: JSON lines with name, status, reason, data."""
    found = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                c = json.loads(line)
            except ValueError:
                continue
            if "name" in c and c.get("status") in STATUSES:
                add_check(work, c["name"], c["status"], c.get("reason", ""))
                found[c["name"]] = c.get("data")
    store(work, key, found)
    return found


def junit(work, path, prefix):
    import xml.etree.ElementTree as ET
    for case in ET.parse(path).getroot().iter("testcase"):
        name = "%s %s::%s" % (prefix, case.get("classname", "").split(".")[-1], case.get("name"))
        status, reason = "pass", "%.1f s" % float(case.get("time") or 0)
        for child in case:
            if child.tag in ("failure", "error"):
                status, reason = "fail", ((child.get("message") or "") + "\n" + (child.text or ""))[-3000:]
            elif child.tag == "skipped":
                status, reason = "skip", child.get("message") or "skipped"
        add_check(work, name, status, reason)


def rows_cover(work, lib, sources):
    """cudaemu's exported cu* entry points (nm) that none of the test sources names (as drv->NAME,
    the loader's names without the _v2 suffixes): where the driver's answers are not compared."""
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    names = sorted({l.split()[-1] for l in out.splitlines() if re.match(r"\S+ T cu[A-Z]", l)})
    text = "".join(open(p).read() for p in sources)
    missing = [n for n in names if not re.search(r"\b%s\b" % re.escape(re.sub(r"_v\d+$", "", n)), text)]
    store(work, "entry_points", {"exported": len(names), "not_in_conformance_tests": missing})


def main(argv):
    if len(argv) >= 4 and argv[0] == "check":
        add_check(argv[1], argv[2], argv[3], " ".join(argv[4:]))
    elif len(argv) == 4 and argv[0] == "data":
        with open(argv[3]) as f:
            store(argv[1], argv[2], json.load(f))
    elif len(argv) == 4 and argv[0] == "lines":
        lines(argv[1], argv[2], argv[3])
    elif len(argv) == 4 and argv[0] == "junit":
        junit(argv[1], argv[2], argv[3])
    elif len(argv) >= 4 and argv[0] == "rows-cover":
        rows_cover(argv[1], argv[2], argv[3:])
    elif len(argv) == 3 and argv[0] == "tests":
        tests(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "list-tests":
        list_tests(argv[1], argv[2])
    elif len(argv) == 7 and argv[0] == "finish-check":
        finish_check(*argv[1:])
    elif len(argv) >= 3 and argv[0] == "not-reached":
        not_reached(argv[1], argv[2], " ".join(argv[3:]))
    elif len(argv) == 2 and argv[0] == "todo":
        todo(argv[1])
    elif len(argv) == 4 and argv[0] == "item-status":
        item_status(*argv[1:])
    elif len(argv) in (4, 5) and argv[0] == "write":
        return write(*argv[1:])
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
