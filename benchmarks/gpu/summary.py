#!/usr/bin/env python3
"""The summaries of the GPU acceptance run (benchmarks/gpu/run.sh), standard library only.

  summary.py check WORK NAME pass|fail|skip [REASON...]   one check of the stage
  summary.py data WORK KEY FILE.json                      a JSON value kept as data[KEY]
  summary.py finish WORK N NAME OUT [--timed-out S]       writes OUT/stageN.json, prints a digest
  summary.py lines WORK FILE KEY                          check lines (torch_checks.py's JSON
                                                          lines): one check each, data[KEY][name]
  summary.py junit WORK FILE.xml PREFIX                   pytest's JUnit XML: one check per test
  summary.py rows-cover WORK LIBCUDAEMU TEST.c...        which of cudaemu's exported entry points
                                                          no conformance test names (data)
  summary.py tests WORK TESTLOG.json                      meson's test log: one check per test,
                                                          one per conformance row (tests/driver)

stageN.json: {"stage", "name", "complete", "emulator", "quick", "date", "commit", "device",
"counts": {"pass", "fail", "skip"}, "checks": [{"name", "status", "reason"}], "data": {...}}.
"""
import datetime
import json
import os
import re
import subprocess
import sys

STATUSES = ("pass", "fail", "skip")


def add_check(work, name, status, reason=""):
    if status not in STATUSES:
        raise SystemExit("summary.py: status must be one of %s, not %r" % (STATUSES, status))
    with open(os.path.join(work, "checks.jsonl"), "a") as f:
        f.write(json.dumps({"name": name, "status": status, "reason": reason}) + "\n")


def git_commit(root):
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(emulator):
    if emulator:
        return "cudaemu (emulator dry run)"
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        lines = [l.strip() for l in r.stdout.splitlines() if l.strip()]
        if lines:
            return "; ".join(lines)
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown (nvidia-smi failed)"


def finish(work, n, name, out, timed_out=None):
    checks = []
    path = os.path.join(work, "checks.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            checks = [json.loads(l) for l in f if l.strip()]
    if timed_out:
        checks.append({"name": "stage time limit", "status": "fail",
                       "reason": "stopped after %s s; the checks above ran, the rest did not" % timed_out})
    data = {}
    ddir = os.path.join(work, "data")
    if os.path.isdir(ddir):
        for fn in sorted(os.listdir(ddir)):
            with open(os.path.join(ddir, fn)) as f:
                data[fn[:-5]] = json.load(f)
    emulator = os.environ.get("XSEG_GPU_EMULATOR") == "1"
    summary = {
        "stage": int(n), "name": name, "complete": not timed_out, "emulator": emulator,
        "quick": os.environ.get("XSEG_GPU_QUICK") == "1",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(os.environ.get("XSEG_GPU_ROOT", ".")), "device": device_name(emulator),
        "counts": {s: sum(c["status"] == s for c in checks) for s in STATUSES},
        "checks": checks, "data": data,
    }
    with open(os.path.join(out, "stage%s.json" % n), "w") as f:
        json.dump(summary, f, indent=1)
    c = summary["counts"]
    print("stage %s (%s) on %s: %d pass, %d fail, %d skip%s" % (n, name, summary["device"], c["pass"], c["fail"],
                                                             c["skip"], "" if not timed_out else ", TIMED OUT"))
    for ch in checks:
        if ch["status"] == "fail":
            print("  FAIL %s: %s" % (ch["name"], ch["reason"].strip().splitlines()[-1] if ch["reason"].strip() else ""))
    return 0


ROW = re.compile(r"^(misuse|capture|graph|exec): (.*?)\s+(?:-> (.*)|skipped \((.*)\))$")


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
    results = {"OK": "pass", "EXPECTEDFAIL": "pass", "SKIP": "skip"}
    per_suite = {}
    rows = []
    with open(testlog) as f:
        for line in f:
            if not line.strip():
                continue
            t = json.loads(line)
            name = t.get("name", "?")
            suite = name.split(" / ")[0].split(":")[-1] if " / " in name else "?"
            status = results.get(t.get("result"), "fail")
            out = t.get("stdout") or ""
            reason = "%s in %.1f s" % (t.get("result"), t.get("duration", 0))
            if status == "fail":
                reason += "\n" + out[-2000:]
            elif status == "skip":
                skips = [l for l in out.splitlines() if "SKIP" in l.upper()]
                reason += ": " + (skips[-1].strip() if skips else "exit status 77")
            add_check(work, "test %s/%s" % (suite, name.split(" / ")[-1]), status, reason)
            s = per_suite.setdefault(suite, {"pass": 0, "fail": 0, "skip": 0})
            s[status] += 1
            # cmocka cases a passing binary skipped (emulator-only checks on the driver, or the reverse)
            for m in re.finditer(r"^\[  SKIPPED \] (\S+)$", out, re.M):
                why = [l for l in out[:m.start()].splitlines()[-3:] if "skip" in l.lower()]
                add_check(work, "case %s/%s" % (name.split(" / ")[-1], m.group(1)), "skip",
                          why[-1].replace("[  SKIPPED ]", "").strip() if why else "skipped by the test")
            for table, what, st, detail in rows_of(out):
                add_check(work, "row %s: %s (%s)" % (table, what, name.split(" / ")[-1]), st, detail)
                rows.append({"test": name.split(" / ")[-1], "table": table, "row": what, "status": st,
                             "result": detail})
    os.makedirs(os.path.join(work, "data"), exist_ok=True)
    with open(os.path.join(work, "data", "suites.json"), "w") as f:
        json.dump(per_suite, f)
    with open(os.path.join(work, "data", "conformance_rows.json"), "w") as f:
        json.dump(rows, f)


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
            value = json.load(f)
        os.makedirs(os.path.join(argv[1], "data"), exist_ok=True)
        with open(os.path.join(argv[1], "data", argv[2] + ".json"), "w") as f:
            json.dump(value, f)
    elif len(argv) in (5, 7) and argv[0] == "finish":
        return finish(argv[1], argv[2], argv[3], argv[4], argv[6] if len(argv) == 7 else None)
    elif len(argv) == 4 and argv[0] == "lines":
        lines(argv[1], argv[2], argv[3])
    elif len(argv) == 4 and argv[0] == "junit":
        junit(argv[1], argv[2], argv[3])
    elif len(argv) >= 4 and argv[0] == "rows-cover":
        rows_cover(argv[1], argv[2], argv[3:])
    elif len(argv) == 3 and argv[0] == "tests":
        tests(argv[1], argv[2])
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
