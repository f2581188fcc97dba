#!/usr/bin/env python3
"""The suites check's per-test time limit: meson runs every test through this wrapper
(`meson test --wrapper`), which runs the test under a limit of its own, so that a test that hangs
costs seconds, not the check's share (the first H200 run lost 300 s to two hung tests, each
stopped only at its meson timeout).

    test_limit.py TESTS.json CMD...      (meson calls it; TESTS.json is `meson introspect --tests`)

The limit is a quarter of the test's meson timeout (those are at least three times its CPU time
on cudaemu, docs/testing.md; on the H200 no test took a tenth of its own, cudaemu being slower),
at least MIN and at most MAX seconds (10 and 90). A test that reaches it is stopped with its
process group (SIGTERM, SIGKILL 2 s later); the wrapper says so on stderr, in words
summary.py's `tests` turns into the item's reason, and exits 124. Otherwise it exits as the test
did (a signal by the same signal, so that meson names it).
A command no test of TESTS.json has gets MAX, and a line on stderr.
Test-only hooks, for the CI dry run: XSEG_GPU_TEST_HANG=NAME runs `sleep 3600` in place of the
test NAME, under a limit of XSEG_GPU_TEST_LIMIT seconds when that is set.
"""
import json
import os
import signal
import subprocess
import sys

MIN_S, MAX_S, FRACTION = 10.0, 90.0, 0.25
MARK = "test_limit.py: timed out"


def limit_of(tests, cmd):
    """(name, seconds) of the test whose command is CMD (the longest limit where several are)."""
    best = None
    for t in tests:
        if t.get("cmd") != cmd:
            continue
        timeout = t.get("timeout") or 0
        secs = MAX_S if timeout <= 0 else min(MAX_S, max(MIN_S, FRACTION * timeout))
        if best is None or secs > best[1]:
            best = (t.get("name", "?"), secs, timeout)
    return best or ("?", MAX_S, 0)


def stop(proc):
    for sig, wait in ((signal.SIGTERM, 2), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        tests = json.load(f)
    cmd = argv[1:]
    name, secs, timeout = limit_of(tests, cmd)
    if name == "?":
        print("test_limit.py: no test of %s runs %s: limit %g s" % (argv[0], " ".join(cmd), secs), file=sys.stderr)
    why = "its own limit: a quarter of its meson timeout of %g s, %g to %g s" % (timeout, MIN_S, MAX_S)
    if name != "?" and name == os.environ.get("XSEG_GPU_TEST_HANG"):
        cmd = ["sleep", "3600"]
        if os.environ.get("XSEG_GPU_TEST_LIMIT"):
            secs, why = float(os.environ["XSEG_GPU_TEST_LIMIT"]), "XSEG_GPU_TEST_LIMIT, a test-only hook"
    proc = subprocess.Popen(cmd, start_new_session=True)
    # Stopped from outside (meson's own timeout, the check's): the test's group goes too.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: (stop(proc), os._exit(128 + s)))
    try:
        rc = proc.wait(secs)
    except subprocess.TimeoutExpired:
        stop(proc)
        print("%s after %g s (%s)" % (MARK, secs, why), file=sys.stderr, flush=True)
        return 124
    if rc < 0:
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        return 128 - rc
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
