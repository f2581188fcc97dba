#!/usr/bin/env python3
"""benchmarks/gpu/compare_pytorch.py without a GPU: --help, and the replay logic on the fake
backend (peaks, failed frees of unknown names, marks, errors naming the line).
usage: test_compare_pytorch.py COMPARE_PYTORCH_PY"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = sys.argv[1]


def run(*args):
    return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)


class ComparePytorch(unittest.TestCase):
    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("xseg.torch.enable", r.stdout)

    def test_fake_replay(self):
        with tempfile.TemporaryDirectory() as d:
            t = os.path.join(d, "t.trace")
            with open(t, "w") as f:
                f.write("stream s\nalloc a 1GiB\nalloc b 512MiB @s  # c\nrecord a @s\nfree a\n"
                        "hold @s\nsync @s\nsync\nempty_cache\nconfig max_split_size_mb:64\n"
                        "alloc c 2GiB\nmark here\nfree b\n")
            r = run("--backend", "fake", "--json", "--modes", "native,xseg", t)
            self.assertEqual(r.returncode, 0, r.stderr)
            rows = [json.loads(l) for l in r.stdout.splitlines()]
            self.assertEqual([x["mode"] for x in rows], ["native", "xseg"])
            for x in rows:
                self.assertEqual(x["peak_allocated_bytes"], (2 << 30) + (512 << 20))
                self.assertEqual(x["allocs"], 3)
                self.assertEqual(x["marks"][0]["mark"], "here")
                self.assertEqual(x["marks"][0]["allocated"], (2 << 30) + (512 << 20))
            r = run("--backend", "fake", t)
            self.assertEqual(r.returncode, 0)
            self.assertIn("peak resv", r.stdout)
            self.assertIn("xseg-classic", r.stdout)

    def test_errors(self):
        with tempfile.TemporaryDirectory() as d:
            t = os.path.join(d, "p.trace")
            with open(t, "w") as f:
                f.write("stream s\nalloc a 1GiB\npool_begin p1 @s\n")
            r = run("--backend", "fake", t)
            self.assertEqual(r.returncode, 1)
            self.assertIn("p.trace:3: pool_begin: not supported yet", r.stderr)
            with open(t, "w") as f:
                f.write("alloc a 12QB\n")
            r = run("--backend", "fake", t)
            self.assertEqual(r.returncode, 1)
            self.assertIn("p.trace:1: bad size '12QB'", r.stderr)
            r = run("--backend", "fake", "--modes", "bogus", t)
            self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
