#!/usr/bin/env python3
"""benchmarks/fit_sweep.py on test_fit_probe.py's hand-made trace (peak allocated 100 MiB): with
PyTorch's layout every size from 102 to 118 MiB fails its last allocation, so the sweep lists those
nine gaps, says every size fits from 120 MiB and exits 1; with the default it lists none and exits
0; --markdown prints the same as a caption and a table row and exits 0, --step-above samples a
trace at or above its peak and marks the row; a bad --step or --step-above or a missing replay
binary gets one line and no traceback.
usage: test_fit_sweep.py FIT_SWEEP_PY XSEG_REPLAY"""
import os
import subprocess
import sys
import tempfile
import unittest

from replay_driver import NEEDS_EMU, emulated

SWEEP, REPLAY = sys.argv[1], sys.argv[2]
TRACE = ("alloc a 20MiB\nalloc h 50MiB\nalloc old 30MiB\nfree a\nfree h\n"
         "alloc y 20MiB\nalloc g 30MiB\nfree y\nalloc r 40MiB\n")


def sweep(*args, replay=REPLAY):
    return subprocess.run([sys.executable, SWEEP, "--replay", replay, "--jobs", "1"] + list(args),
                          capture_output=True, text=True, timeout=300)


@unittest.skipUnless(emulated(REPLAY), NEEDS_EMU)  # every device size of a band, emulated
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

    def test_markdown(self):
        layout = "expandable_segments:True,expandable_segments_recycle:False"
        r = sweep("--config", layout, "--hi", "1.25", "--markdown", self.trace)
        self.assertEqual(r.returncode, 0, r.stderr)  # the gaps are in the table, not the status
        lines = r.stdout.splitlines()
        head = lines.index("| trace | peak allocated (MiB) | sizes replayed (MiB) | step (MiB) | "
                           "gaps (MiB: failed allocations) | fits from (MiB) | / peak |")
        self.assertTrue(lines[head - 2].startswith(f"Each trace replayed with `{layout}`"))
        self.assertIn("every 2 MiB.", lines[head - 2])
        self.assertEqual(lines[head + 1], "|---|---|---|---|---|---|---|")
        gaps = ", ".join(f"{m}: 1" for m in range(102, 120, 2))
        self.assertEqual(lines[head + 2], f"| t | 100.0 | 12: 102–124 | 2 | {gaps} | 120 | 1.2000 |")
        self.assertIn("0 of 1 traces with no gap in the band.", r.stdout)
        # 100 MiB of peak is above 0.05 GiB: every 4 MiB, 102-122, the row says it is sampled
        r = sweep("--config", layout, "--hi", "1.25", "--markdown", "--step-above", "0.05:4", self.trace)
        self.assertEqual(r.returncode, 0, r.stderr)
        gaps = ", ".join(f"{m}: 1" for m in range(102, 120, 4))
        self.assertIn(f"| t | 100.0 | 6: 102–122 | 4 (sampled) | {gaps} | 122 | 1.2200 |", r.stdout)
        self.assertIn("every 4 MiB from 0.05 GiB on (those rows are sampled", r.stdout)
        # below the threshold the row keeps 2 MiB steps; no gap reads "none"
        r = sweep("--markdown", "--step-above", "1:64", self.trace)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| t | 100.0 | 5: 102–110 | 2 | none | 102 | 1.0200 |", r.stdout)
        self.assertIn("1 of 1 traces with no gap in the band.", r.stdout)

    def test_bad_input(self):
        r = sweep("--step", "3", self.trace)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--step must be a multiple of 2 MiB", r.stderr)
        for bad in ("10", "10:63", "x:64", "0:64"):
            r = sweep("--step-above", bad, self.trace)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("--step-above wants", r.stderr)
        r = sweep(self.trace, replay=os.path.join(self.dir.name, "missing"))
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn("fit_sweep.py: cannot run", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
