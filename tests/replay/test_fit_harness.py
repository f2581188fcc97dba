#!/usr/bin/env python3
"""benchmarks/fit_harness.py, in two parts.

The harness's arithmetic against a stand-in replay (a script here that answers from a table
written into each trace, so that every row is known): the smallest gap-free device, the gaps
(failing sizes above one that fits, not below it), the PyTorch layout column, the acceptance rule
(no trace worse by more than one 2 MiB step, the mean lower), the split (pairs by peak, a
candidate chosen on the tuning half without the held-out half, then proven there), --half, the
cache, and bad input answered in one line.

Then xseg-replay itself on two hand-made traces (CI's two traces): PyTorch's expandable layout
(expandable_segments_recycle:False) as the baseline against the default, whose rows and verdict
are what the replays say; --markdown's table as benchmarks/record.py takes it.
usage: test_fit_harness.py FIT_HARNESS_PY XSEG_REPLAY"""
import os
import subprocess
import sys
import tempfile
import unittest

from replay_driver import NEEDS_EMU, emulated

HARNESS, REPLAY = sys.argv[1], sys.argv[2]
MIB = 1 << 20

# The stand-in: `--config PROFILE`; the trace's line "# fake PROFILE peak=P fail=A-B,C" (MiB) says
# the peak and which device sizes fail (with two failed allocations each). Every call is logged.
FAKE = r'''#!/usr/bin/env python3
import json, os, sys
a = sys.argv[1:]
cfg = a[a.index("--config") + 1] if "--config" in a else ""
mem = int(a[a.index("--device-mem") + 1]) >> 20 if "--device-mem" in a else 80 << 10
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(f"{cfg} {mem} {os.path.basename(a[-1])}\n")
peak, fails = None, set()
for line in open(a[-1]):
    w = line.split()
    if w[:3] == ["#", "fake", cfg or "-"]:
        for kv in w[3:]:
            k, v = kv.split("=")
            if k == "peak":
                peak = int(v)
            elif v:
                for r in v.split(","):
                    lo, _, hi = r.partition("-")
                    fails.update(range(int(lo), int(hi or lo) + 1, 2))
fail = 2 if mem in fails or mem < peak else 0
print(json.dumps({"peak_allocated_bytes": peak << 20, "failed_allocs": fail}))
'''

TRACE = ("alloc a 20MiB\nalloc h 50MiB\nalloc old 30MiB\nfree a\nfree h\n"
         "alloc y 20MiB\nalloc g 30MiB\nfree y\nalloc r 40MiB\n")
TRACE2 = "alloc w 10MiB\nalloc x 30MiB\nfree w\nalloc z 12MiB\nfree x\nalloc v 40MiB\n"


def harness(*args, env=None):
    return subprocess.run([sys.executable, HARNESS, "--jobs", "2"] + list(args), capture_output=True, text=True,
                          timeout=300, env=env)


class Arithmetic(unittest.TestCase):
    """Rows and verdicts against the stand-in (peaks of 100 MiB: bands of 100-110 MiB in 2 MiB steps)."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        self.fake = os.path.join(d, "xseg-replay")
        with open(self.fake, "w") as f:
            f.write(FAKE)
        os.chmod(self.fake, 0o755)
        self.log = os.path.join(d, "log")
        self.env = dict(os.environ, FAKE_LOG=self.log)

    def tearDown(self):
        self.dir.cleanup()

    def trace(self, name, lines):
        path = os.path.join(self.dir.name, name + ".trace")
        with open(path, "w") as f:
            f.write("".join(f"# fake {p} {spec}\n" for p, spec in lines.items()) + "alloc x 1MiB\n")
        return path

    def run_h(self, *args, sides=(("before", "b"), ("after", "a")), layout="l"):
        s = []
        for name, prof in sides:
            s += ["--side", name, self.fake, prof]
        return harness(*s, "--layout", layout, "--no-builtin", *args, env=self.env)

    def test_rows_and_accept(self):
        # p: before fits from 106 with a gap at 104 (102 fits); after from 100; layout from 108.
        # q: before from 102 (100 fails: not a gap); after 104, one step worse; layout 100.
        p = self.trace("p", {"b": "peak=100 fail=100,104", "a": "peak=100 fail=", "l": "peak=100 fail=100-106"})
        q = self.trace("q", {"b": "peak=100 fail=100", "a": "peak=100 fail=100-102", "l": "peak=100 fail="})
        r = self.run_h(p, q)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = r.stdout
        self.assertIn("p: peak 100.0 MiB, every 2 MiB; before fits from 106 (1.0600), gaps 104; after fits from "
                      "100 (1.0000), gaps none; delta -6 MiB; layout 108 (1.0800) (-8 MiB)", out)
        self.assertIn("q: peak 100.0 MiB, every 2 MiB; before fits from 102 (1.0200), gaps none; after fits from "
                      "104 (1.0400), gaps none; delta +2 MiB; layout 100 (1.0000) (+4 MiB)", out)
        self.assertIn("verdict, all traces (2 traces): after ACCEPTED against the baseline: mean fits from / peak "
                      "1.0400 -> 1.0200", out)
        self.assertIn("goals, every trace shown: before: 1 of 2 fit at 1.01 x peak allocated (not: p); 1 with no "
                      "gap (gaps: p); 2 within one 2 MiB step of the PyTorch layout", out)
        self.assertIn("goals, every trace shown: after: 1 of 2 fit at 1.01 x peak allocated (not: q); 2 with no gap; "
                      "1 within one 2 MiB step of the PyTorch layout (over: q)", out)

    def test_reject(self):
        # worse by two steps on p: rejected though the mean improves
        p = self.trace("p", {"b": "peak=100 fail=100", "a": "peak=100 fail=100-104", "l": "peak=100 fail="})
        q = self.trace("q", {"b": "peak=100 fail=100-108", "a": "peak=100 fail=", "l": "peak=100 fail="})
        r = self.run_h(p, q)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("after REJECTED against the baseline: mean fits from / peak 1.0600 -> 1.0300; worse by more "
                      "than one 2 MiB step on p (+4 MiB)", r.stdout)
        # the same on every trace: the mean does not improve
        r = self.run_h(p, sides=(("before", "b"), ("same", "b")))
        self.assertEqual(r.returncode, 1)
        self.assertIn("same REJECTED against the baseline: mean fits from / peak 1.0200 -> 1.0200; the mean does not "
                      "improve", r.stdout)
        # a band whose last size fails: "above", counted one step past the band's end
        q2 = self.trace("q2", {"b": "peak=100 fail=", "a": "peak=100 fail=110", "l": "peak=100 fail="})
        r = self.run_h(q2)
        self.assertIn("after fits from above, gaps 110", r.stdout)
        self.assertIn("delta +12 MiB", r.stdout)

    def test_sampled_band_refined(self):
        # every 6 MiB: 100 fails, 106 and 112 fit; the sizes between 100 and 106 are replayed too,
        # and fits from is 104 (102 fails), not the sample's 106
        p = self.trace("p", {"b": "peak=100 fail=100-102", "a": "peak=100 fail=100-102", "l": "peak=100 fail="})
        r = self.run_h("--step", "6", "--hi", "1.12", p)
        self.assertIn("before fits from 104 (1.0400), gaps none; after fits from 104 (1.0400)", r.stdout)
        with open(self.log) as f:
            sizes = sorted({int(line.split()[1]) for line in f if line.startswith("b ")})
        self.assertEqual(sizes, [100, 102, 104, 106, 112, 80 << 10])
        # a failure among the refined sizes above a fitting one is a gap
        q = self.trace("q", {"b": "peak=100 fail=100,104", "a": "peak=100 fail=100,104", "l": "peak=100 fail="})
        r = self.run_h("--step", "6", "--hi", "1.12", q)
        self.assertIn("before fits from 106 (1.0600), gaps 104;", r.stdout)

    def test_split(self):
        # four traces of distinct peaks: two pairs, one of each to each half
        specs = {}
        for i in range(4):
            pk = 100 + 20 * i
            specs[f"t{i}"] = {"b": f"peak={pk} fail={pk}-{pk + 4}", "g": f"peak={pk} fail={pk}",
                              "w": f"peak={pk} fail=", "l": f"peak={pk} fail="}
        # w is better everywhere but on t0 and t1 (a pair, so one of them in each half), where it is
        # three steps worse: the rule rejects it on both halves; g is two steps better everywhere
        specs["t0"]["w"] = "peak=100 fail=100-110"
        specs["t1"]["w"] = "peak=120 fail=120-130"
        paths = [self.trace(n, s) for n, s in specs.items()]
        sides = (("before", "b"), ("worse", "w"), ("good", "g"))
        cache = os.path.join(self.dir.name, "cache")
        # --half tune first: nothing of the held-out half is replayed but the baseline's peak (80 GiB),
        # which the split ranks by
        r = self.run_h("--split", "--half", "tune", "--cache", cache, *paths, sides=sides)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("held-out", r.stdout)
        tune = {l[1:].split("] ")[1].split(":")[0] for l in r.stdout.splitlines() if l.startswith("[")}
        self.assertEqual(len(tune), 2)
        self.assertTrue(("t0" in tune) != ("t1" in tune) and ("t2" in tune) != ("t3" in tune), tune)
        with open(self.log) as f:
            calls = [c.split() for c in f.read().splitlines()]
        self.assertEqual({c[2][:-6] for c in calls if c[:2] != ["b", str(80 << 10)]}, tune)
        self.assertEqual({c[2][:-6] for c in calls}, set(specs))
        self.assertIn("verdict, tuning half (2 traces): worse REJECTED", r.stdout)
        self.assertIn("verdict, tuning half (2 traces): good ACCEPTED", r.stdout)
        self.assertIn("chosen on the tuning half: good", r.stdout)
        # both halves (the tuning half from the cache): the chosen one alone is replayed on the
        # held-out half, and proven there
        r = self.run_h("--split", "--cache", cache, *paths, sides=sides)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = r.stdout.splitlines()
        halves = {l[1:].split("] ")[1].split(":")[0]: l[1:].split("]")[0] for l in out if l.startswith("[")}
        self.assertEqual(sorted(halves), sorted(specs))
        self.assertEqual({n for n, h in halves.items() if h == "tune"}, tune)
        self.assertIn("verdict, held-out half (2 traces): good ACCEPTED against the baseline: mean fits from / "
                      "peak 1.0514 -> 1.0171", out)
        with open(self.log) as f:
            calls = [c.split() for c in f.read().splitlines()]
        self.assertFalse([c for c in calls if c[0] == "w" and c[2][:-6] not in tune])
        # --markdown: a half column, the verdicts after the table, status 0; nothing replayed again
        n = len(calls)
        r = self.run_h("--split", "--markdown", "--cache", cache, *paths, sides=sides)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| half | trace | peak allocated (MiB) | step (MiB) | before: fits from | before: gaps | "
                      "good: fits from | good: gaps | Δ | layout: fits from | vs layout |", r.stdout)
        self.assertIn("| tune | t", r.stdout)
        self.assertIn("| held-out | t", r.stdout)
        self.assertIn("chosen on the tuning half: good", r.stdout)
        with open(self.log) as f:
            self.assertEqual(len(f.read().splitlines()), n)

    def test_cache(self):
        p = self.trace("p", {"b": "peak=100 fail=100", "a": "peak=100 fail=", "l": "peak=100 fail="})
        cache = os.path.join(self.dir.name, "cache")
        first = self.run_h("--cache", cache, p)
        with open(self.log) as f:
            n = len(f.read().splitlines())
        self.assertEqual(n, 3 * (1 + 6))  # a peak and six sizes for each side and the layout
        again = self.run_h("--cache", cache, p)
        with open(self.log) as f:
            self.assertEqual(len(f.read().splitlines()), n)  # nothing replayed again
        self.assertEqual(first.stdout, again.stdout)

    def test_bad_input(self):
        p = self.trace("p", {"b": "peak=100 fail="})
        for args, msg in ((["--step", "3"], "--step must be a multiple of 2 MiB"),
                          (["--step-above", "10"], "--step-above wants"),
                          (["--side", "a", self.fake, ""], "--side wants a baseline and at least one candidate"),
                          (["--side", "a", self.fake, "", "--side", "a", self.fake, ""], "--side names must differ"),
                          (["--side", "a", self.fake, "", "--side", "b", self.fake, "", "--side", "c", self.fake,
                            ""], "more than one candidate needs --split"),
                          (["--half", "tune"], "--half needs --split"),
                          (["--lo", "1.2", "--hi", "1.1"], "--lo and --hi want")):
            r = harness(*args, p, env=self.env)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(msg, r.stderr, args)
        r = harness("--side", "a", os.path.join(self.dir.name, "missing"), "", "--side", "b", self.fake, "", p,
                    env=self.env)
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn("is not an executable", r.stderr)


@unittest.skipUnless(emulated(REPLAY), NEEDS_EMU)  # every device size of a band, emulated
class TwoTraces(unittest.TestCase):
    """xseg-replay on two hand-made traces: PyTorch's expandable layout against the default."""

    def test_layout_against_default(self):
        with tempfile.TemporaryDirectory() as d:
            for name, text in (("t", TRACE), ("u", TRACE2)):
                with open(os.path.join(d, name + ".trace"), "w") as f:
                    f.write(text)
            layout = "expandable_segments:True,expandable_segments_recycle:False"
            r = harness("--side", "layout", REPLAY, layout, "--side", "default", REPLAY, "", "--hi", "1.25",
                        "--no-builtin", "--markdown", d)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = r.stdout
            # t: the layout fails 100-118 MiB and fits from 120 (no gap: nothing below fits); the
            # default fits from its peak (test_fit_sweep.py's figures)
            self.assertIn("| t | 100.0 | 2 | 120 (1.2000) | none | 100 (1.0000) | none | -20 | 120 (1.2000) | -20 |", out)
            self.assertRegex(out, r"\n\| u \| 52\.0 \| 2 \| [0-9]+ \(1\.[0-9]{4}\) \| none \| 52 \(1\.0000\) \| none \|")
            self.assertIn("verdict, all traces (2 traces): default ACCEPTED against the baseline", out)
            self.assertIn("goals, every trace shown: default: 2 of 2 fit at 1.01 x peak allocated; 2 with no gap; "
                          "2 within one 2 MiB step of the PyTorch layout", out)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
