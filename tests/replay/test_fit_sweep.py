#!/usr/bin/env python3
"""benchmarks/fit_sweep.py on test_fit_probe.py's hand-made trace (peak allocated 100 MiB): with
PyTorch's layout every size from 102 to 118 MiB fails its last allocation, so the sweep lists those
nine gaps, says every size fits from 120 MiB and exits 1; with the default it lists none and exits
0; a bad --step or a missing replay binary gets one line and no traceback.
usage: test_fit_sweep.py FIT_SWEEP_PY XSEG_REPLAY"""
import os
import subprocess
import sys
import tempfile
import unittest

SWEEP, REPLAY = sys.argv[1], sys.argv[2]
TRACE = ("alloc a 20MiB\nalloc h 50MiB\nalloc old 30MiB\nfree a\nfree h\n"
         "alloc y 20MiB\nalloc g 30MiB\nfree y\nalloc r 40MiB\n")


def sweep(*args, replay=REPLAY):
    return subprocess.run([sys.executable, SWEEP, "--replay", replay, "--jobs", "1"] + list(args),
                          capture_output=True, text=True, timeout=300)


class FitSweep(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.trace = os.path.join(self.dir.name, "t.trace")
        with open(self.trace, "w") as f:
            f.write(TRACE)

    def tearDown(self):
        self.dir.cleanup()

    def test_gaps_listed(self):
        r = sweep("--config", "expandable_segments:True,expandable_segments_recycle:False",
                  "--hi", "1.25", self.trace)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("t: peak 100.0 MiB, 12 sizes 102-124 MiB", r.stdout)
        gaps = ", ".join(f"{m} (1)" for m in range(102, 120, 2))
        self.assertIn(f"gaps (MiB, failed allocations): {gaps};", r.stdout)
        self.assertIn("every size fits from 120 MiB (x 1.2000)", r.stdout)

    def test_no_gap(self):
        r = sweep("--config", "expandable_segments:True", self.dir.name)  # a folder: its *.trace
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("t: peak 100.0 MiB, 5 sizes 102-110 MiB, gaps (MiB, failed allocations): none;",
                      r.stdout)

    def test_bad_input(self):
        r = sweep("--step", "3", self.trace)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--step must be a multiple of 2 MiB", r.stderr)
        r = sweep(self.trace, replay=os.path.join(self.dir.name, "missing"))
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn("fit_sweep.py: cannot run", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
