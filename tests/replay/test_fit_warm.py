#!/usr/bin/env python3
"""benchmarks/fit_warm.py: the two-pass trace it writes, its counting of each pass's failed
allocations (against a stand-in replay that fails where told), its exit status, and xseg-replay
itself on a hand-made trace.
usage: test_fit_warm.py FIT_WARM_PY XSEG_REPLAY"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

from replay_driver import NEEDS_EMU, emulated

FIT_WARM, REPLAY = sys.argv[1], sys.argv[2]

# The stand-in: peak reserved 100 MiB; with a memory fraction in the trace, every `alloc` line whose
# buffer starts with "w_" and whose size is 64MiB fails (the second pass's big requests).
FAKE = r'''#!/usr/bin/env python3
import json, sys
trace = sys.argv[-1]
capped = False
failed = 0
for n, line in enumerate(open(trace), 1):
    w = line.split()
    if w[:1] == ["config"] and "per_process_memory_fraction" in w[1]:
        capped = True
    if capped and w[:1] == ["alloc"] and w[1].startswith("w_") and w[2] == "64MiB":
        sys.stderr.write("%s:%d: alloc %s 64MiB failed (XSEG_ERROR_OUT_OF_MEMORY): out of memory\n" % (trace, n, w[1]))
        failed += 1
print(json.dumps({"peak_reserved_bytes": 100 << 20, "failed_allocs": failed}))
'''

TRACE = """# a hand-made trace
stream s1
alloc a 64MiB @s1
alloc b 1MiB
free a
alloc c 64MiB
record b @s1
"""


def load_module():
    spec = importlib.util.spec_from_file_location("fit_warm", FIT_WARM)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(FIT_WARM))
    spec.loader.exec_module(mod)
    return mod


class FitWarm(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.trace = os.path.join(self.tmp.name, "hand.trace")
        with open(self.trace, "w") as f:
            f.write(TRACE)

    def tearDown(self):
        self.tmp.cleanup()

    def run_tool(self, *args):
        return subprocess.run([sys.executable, FIT_WARM, *args], capture_output=True, text=True, timeout=300)

    def test_two_passes(self):
        """Streams once, the cap first, pass one, the live buffers freed, empty_cache, pass two renamed."""
        out = os.path.join(self.tmp.name, "two.trace")
        second = load_module().two_passes(self.trace, out, 0.25)
        with open(out) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[:3], ["# a hand-made trace", "stream s1", "config per_process_memory_fraction:0.250000000000"])
        self.assertEqual(lines[3:8], ["alloc a 64MiB @s1", "alloc b 1MiB", "free a", "alloc c 64MiB", "record b @s1"])
        self.assertEqual(sorted(lines[8:10]), ["free b", "free c"])
        self.assertEqual(lines[10], "empty_cache")
        self.assertEqual(second, 12)
        self.assertEqual(lines[11:], ["alloc w_a 64MiB @s1", "alloc w_b 1MiB", "free w_a", "alloc w_c 64MiB",
                                      "record w_b @s1"])
        self.assertEqual(sum(1 for l in lines if l.startswith("stream")), 1)

    def test_counts_each_pass(self):
        """The stand-in fails the second pass's two 64 MiB requests under the cap: 0 / 2, exit 1;
        --markdown prints the same table and exits 0."""
        fake = os.path.join(self.tmp.name, "fake-replay")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, 0o755)
        p = self.run_tool("--side", "fake", fake, "--jobs", "1", self.trace)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("| hand | 100 | 0 | 0 / 2 |", p.stdout)
        self.assertIn("fake: 0 of 1 traces fit warm under the cold peak (not: hand)", p.stdout)
        p = self.run_tool("--side", "fake", fake, "--jobs", "1", "--markdown", self.trace)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("Fit after a warm run"), p.stdout)

    def test_xseg_replay(self):
        """xseg-replay on the hand-made trace: it fits warm under its cold peak."""
        if not emulated(REPLAY):
            self.skipTest(NEEDS_EMU)
        p = self.run_tool("--side", "xseg", REPLAY, "--jobs", "1", "--device-mem", "1G", self.trace)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("| hand | ", p.stdout)
        self.assertIn("xseg: 1 of 1 traces fit warm under the cold peak", p.stdout)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
