#!/usr/bin/env python3
"""benchmarks/lifetime_probe.py on a hand-made trace whose counts are worked out below: a seed
(not scored), three 8 MiB blocks from one stack never freed, an 8 MiB and a 2 MiB temporary, a
small block (not scored); --life 0 makes every block long-lived; --write-mask writes a rule's
action indices; bad input gets one line.
usage: test_lifetime_probe.py LIFETIME_PROBE_PY"""
import os
import subprocess
import sys
import tempfile
import unittest

PROBE = sys.argv[1]
TRACE = """# action indices on the right
alloc pre0 8MiB
alloc a 2MiB ^k1      # 1: freed after 1 action
free a
alloc g1 8MiB ^k2     # 3: never freed
alloc g2 8MiB ^k2
alloc t 8MiB ^k3      # 5: freed after 1 action
free t
alloc g3 8MiB ^k2     # 7: never freed
alloc s 512KiB
"""


def rows(out):
    """{rule: [predicted, precision, recall, long MiB predicted short, short MiB predicted long]}
    of the per-trace table."""
    got = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 9 and cells[3] and cells[4].isdigit():
            got[cells[3]] = cells[4:]
    return got


def probe(*args):
    return subprocess.run([sys.executable, PROBE] + list(args), capture_output=True, text=True)


class LifetimeProbe(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        os.mkdir(os.path.join(self.dir.name, "dev"))
        self.trace = os.path.join(self.dir.name, "dev", "t.trace")
        with open(self.trace, "w") as f:
            f.write(TRACE)

    def tearDown(self):
        self.dir.cleanup()

    def test_counts(self):
        r = probe(self.dir.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| dev/t.trace | 5 | 3 (24) |", r.stdout)
        got = rows(r.stdout)
        self.assertEqual(got["all"], ["5", "60.0", "100.0", "0", "10"])
        # Of g1, g2 and g3 only g3 has two earlier blocks from its stack, both live.
        self.assertEqual(got["stack-live"], ["1", "100.0", "33.3", "16", "0"])
        # g2 (pre0 and g1 live) and t (pre0, g1, g2 live); g3 comes after t's free.
        self.assertEqual(got["size-live"], ["2", "50.0", "33.3", "16", "8"])
        self.assertEqual(got["frees>mallocs"], ["0", "-", "0.0", "24", "0"])
        self.assertIn("| size-live | 2 | 50.0 (50.0) | 33.3 (33.3) | 16 | 8 |", r.stdout)

    def test_life(self):
        r = probe("--life", "0", self.dir.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| dev/t.trace | 5 | 5 (34) |", r.stdout)
        self.assertEqual(rows(r.stdout)["all"], ["5", "100.0", "100.0", "0", "0"])

    def test_write_mask(self):
        # The action indices each rule predicts long (see test_counts), for XSEG_REPLAY_ORACLE=file:.
        mask = os.path.join(self.dir.name, "mask")
        for rule, want in (("stack-live", "7\n"), ("size-live", "4\n5\n"), ("all", "1\n3\n4\n5\n7\n"),
                           ("frees>mallocs", "")):
            r = probe("--write-mask", rule, mask, self.dir.name)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(mask) as f:
                self.assertEqual(f.read(), want, rule)
        for args, what in ((["--write-mask", "oracle", mask, self.dir.name], "--write-mask: no rule 'oracle'"),
                           (["--write-mask", "all", self.dir.name, self.dir.name], "Is a directory"),
                           (["--write-mask", "all", mask, self.dir.name, self.dir.name],
                            "a mask is for one trace, found 2")):
            r = probe(*args)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(what, r.stderr)
            self.assertNotIn("Traceback", r.stderr)

    def test_bad_input(self):
        empty = os.path.join(self.dir.name, "empty")
        os.mkdir(empty)
        for args, what in (([os.path.join(self.dir.name, "nodir")], "no such directory"),
                           ([empty], "no .trace files"),
                           (["--life", "-1", self.dir.name], "--life must be 0 or more")):
            r = probe(*args)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(what, r.stderr)
            self.assertNotIn("Traceback", r.stderr)
        for text, what in (("free x\n", "t.trace:1: free x: no live buffer of that name"),
                           ("free\n", "t.trace:1: free : no live buffer"),
                           ("alloc x 3Q\n", "t.trace:1: bad size '3Q'"),
                           ("alloc x\n", "t.trace:1: alloc needs a buffer and a size")):
            with open(self.trace, "w") as f:
                f.write(text)
            r = probe(self.dir.name)
            self.assertEqual(r.returncode, 1)
            self.assertIn(what, r.stderr)
            self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
