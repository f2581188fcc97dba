#!/usr/bin/env python3
"""benchmarks/fit_probe.py on a hand-made trace (a backward pass in miniature): with
PyTorch's layout (and with one chunk a page) the last allocation fails on a 102 MiB device and the
report names the pages that hold free and live bytes and the blocks that pin them; on a device
20 MiB larger it fits, and with the default's small-device chunks too; bad input gets one line, no
traceback.
usage: test_fit_probe.py FIT_PROBE_PY XSEG_REPLAY"""
import os
import subprocess
import sys
import tempfile
import unittest

from replay_driver import NEEDS_EMU, emulated

PROBE, REPLAY = sys.argv[1], sys.argv[2]
TRACE = ("alloc a 20MiB\nalloc h 50MiB\nalloc old 30MiB\nfree a\nfree h\n"
         "alloc y 20MiB\nalloc g 30MiB\nfree y\nalloc r 40MiB\n")


def probe(*args):
    return subprocess.run([sys.executable, PROBE, "--replay", REPLAY] + list(args),
                          capture_output=True, text=True)


@unittest.skipUnless(emulated(REPLAY), NEEDS_EMU)  # it replays on emulated devices of given sizes
class FitProbe(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.trace = os.path.join(self.dir.name, "t.trace")
        with open(self.trace, "w") as f:
            f.write(TRACE)

    def tearDown(self):
        self.dir.cleanup()

    def test_pytorch_layout_fails(self):
        r = probe("--config", "expandable_segments:True,expandable_segments_recycle:False",
                  "--device-mem", str(102 << 20), self.trace)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("first failed allocation at line 9: 40.0 MiB", r.stdout)
        self.assertIn("2 hold live and free bytes, 20 MiB free inside them", r.stdout)
        self.assertIn("free runs (MiB, largest first): 20.0 (1 in all)", r.stdout)
        self.assertIn("pinning live blocks: 2; by size (MiB x count): 30.0 x 2", r.stdout)
        self.assertIn("freed later in the trace: 0; never: 2", r.stdout)

    def test_page_chunks_fail_default_and_larger_fit(self):
        pages = "expandable_segments:True,expandable_chunk_mb:20"
        r = probe("--config", pages, self.trace)  # peak allocated (100 MiB) x 1.01: 102 MiB
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("first failed allocation at line 9: 40.0 MiB", r.stdout)
        r = probe("--config", pages, "--device-mem", str(122 << 20), self.trace)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("no failed allocation on a device of 122 MiB", r.stdout)
        # The default maps 2 MiB chunks on a device this small (core/policy/expandable.c device_chunk).
        r = probe(self.trace)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("no failed allocation on a device of 102 MiB", r.stdout)

    def test_bad_input(self):
        for args, what in ((["/nonexistent.trace"], "no such trace file"),
                           (["--page", "0", self.trace], "must be positive")):
            r = probe(*args)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(what, r.stderr)
            self.assertNotIn("Traceback", r.stderr)
        r = subprocess.run([sys.executable, PROBE, "--replay", "/nonexistent", self.trace],
                           capture_output=True, text=True)
        self.assertIn("is not an executable", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
