#!/usr/bin/env python3
"""benchmarks/front_table.py --no-callgrind on hand-made traces: the offline bounds of a front of
freed blocks (exact rounded sizes, power-of-two classes) and the "keeping the placement" column,
which reads the replay's own addresses (xseg-replay --history --snapshot), each counted by hand
below; bad input answered in one line.
usage: test_front_table.py FRONT_TABLE_PY XSEG_REPLAY"""
import os
import subprocess
import sys
import tempfile
import unittest

from replay_driver import NEEDS_EMU, emulated

TABLE, REPLAY = sys.argv[1], sys.argv[2]
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(REPLAY)))  # BUILD/tools/xseg-replay

# Small pool, one stream. c takes a's place (freed, untouched since, same size): kept. b and c's
# frees merge with the free rest of the segment, so d (8 KiB) lands at a's address over both, and
# e after d: neither is kept. The bound's front holds a, b and c by size: c and e are served (e by
# b or c's block, wherever it lies); d's size was never freed.
TRACE = ("alloc a 4096\nalloc b 4096\nfree a\nalloc c 4096\nfree b\nfree c\n"
         "alloc d 8192\nalloc e 4096\n")


def run(*args):
    return subprocess.run([sys.executable, TABLE, "--no-callgrind", "--build", BUILD] + list(args),
                          capture_output=True, text=True, timeout=120)


class FrontTable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not emulated(REPLAY):
            raise unittest.SkipTest(NEEDS_EMU)
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def row(self, path):
        p = run(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.strip().splitlines()
        self.assertEqual(len(lines), 3, p.stdout)
        head = [c.strip() for c in lines[0].strip("|").split("|")]
        cells = [c.strip() for c in lines[2].strip("|").split("|")]
        return dict(zip(head, cells))

    def test_bound_and_kept(self):
        r = self.row(self.write("hand.trace", TRACE))
        self.assertEqual(r["trace"], "hand")
        self.assertEqual((r["mallocs"], r["frees"]), ("5", "3"))
        self.assertEqual(r["bound: mallocs / frees a front can serve"], "40.0 % / 100.0 %")
        self.assertEqual(r["bound, power-of-two classes: mallocs"], "40.0 %")  # 4 and 8 KiB: classes apart
        self.assertEqual(r["keeping the placement: mallocs"], "20.0 %")

    def test_power_of_two_classes(self):
        # 5,000 B rounds to 5 KiB, whose class is 8 KiB: b (8 KiB) is served by a's block there only.
        r = self.row(self.write("class.trace", "alloc a 5000\nfree a\nalloc b 8192\n"))
        self.assertEqual(r["bound: mallocs / frees a front can serve"], "0.0 % / 100.0 %")
        self.assertEqual(r["bound, power-of-two classes: mallocs"], "50.0 %")
        self.assertEqual(r["keeping the placement: mallocs"], "0.0 %")

    def test_kept_needs_the_same_size(self):
        # x (8 KiB) over a and b's merged blocks, freed; y (4 KiB) then comes back at x's address:
        # the freed block there is 8 KiB, so y is no block that waited whole. z takes y's place.
        r = self.row(self.write("size.trace", "alloc a 4096\nalloc b 4096\nfree a\nfree b\nalloc x 8192\n"
                                "free x\nalloc y 4096\nalloc k 4096\nfree y\nalloc z 4096\n"))
        self.assertEqual(r["keeping the placement: mallocs"], "16.7 %")  # z of 6

    def test_bound_only(self):
        # No replay: no build folder needed, and the same bounds as the full table's.
        p = subprocess.run([sys.executable, TABLE, "--bound-only", self.write("b.trace", TRACE)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip().splitlines()[2], "| b | 5 | 40.0 % | 40.0 % |")

    def test_missing_trace(self):
        for args in (["--bound-only"], ["--no-callgrind", "--build", BUILD]):
            p = subprocess.run([sys.executable, TABLE] + args + [os.path.join(self.tmp.name, "none.trace")],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("none.trace: no such trace file", p.stderr)
            self.assertNotIn("Traceback", p.stderr)
            self.assertEqual(p.stdout, "")

    def test_bad_build(self):
        p = subprocess.run([sys.executable, TABLE, "--no-callgrind", "--build", self.tmp.name,
                            self.write("one.trace", "alloc a 4096\n")], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("front_table:", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(p.stdout, "")  # no table begun


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
