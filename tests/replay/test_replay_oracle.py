#!/usr/bin/env python3
"""XSEG_REPLAY_ORACLE (an experiment of issue 33) through xseg-replay's command line: an
allocation never freed in the trace goes to a private pool of its own (its segment in the
snapshot names a pool other than the default), one freed goes there only when it lives longer
than N actions; with file:PATH the allocations the file lists; sizes and peaks do not change;
a bad value or mask file gets one line, no crash.
usage: test_replay_oracle.py XSEG_REPLAY"""
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

from replay_driver import NEEDS_EMU, emulated

REPLAY = sys.argv[1]
# keep is never freed; a lives 4 actions (alloc at 0, free at 4), b 1 (alloc at 2, free at 3).
TRACE = "alloc a 20MiB\nalloc keep 30MiB\nalloc b 10MiB\nfree b\nfree a\n"
NAMES = ["a", "keep", "b"]  # buffer indices in order of first use


def pools_of(snapshot, addr_log, names=NAMES):
    """{buffer name: the pool id of the segment its allocation went to} (the address log gives
    each allocation's address, the snapshot each segment's range and pool)."""
    with open(snapshot, "rb") as f:
        segs = pickle.load(f)["segments"]
    out = {}
    with open(addr_log) as f:
        for line in f:
            w = line.split()
            if w[0] != "a":
                continue
            addr = int(w[3], 16)
            pool = [tuple(s["segment_pool_id"]) for s in segs
                    if s["address"] <= addr < s["address"] + s["total_size"]]
            out[names[int(w[2])]] = pool[0] if len(pool) == 1 else None
    return out


class Oracle(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.trace = os.path.join(self.dir.name, "t.trace")
        with open(self.trace, "w") as f:
            f.write(TRACE)

    def tearDown(self):
        self.dir.cleanup()

    def replay(self, oracle, extra=(), names=NAMES):
        snap = os.path.join(self.dir.name, "s.pickle")
        log = os.path.join(self.dir.name, "addr.log")
        env = dict(os.environ, XSEG_REPLAY_ADDR_LOG=log)
        env.pop("XSEG_REPLAY_ORACLE", None)
        if oracle is not None:
            env["XSEG_REPLAY_ORACLE"] = oracle
        r = subprocess.run([REPLAY, "--summary=json", "--marks=none", "--config", "expandable_segments:True",
                            "--snapshot", snap] + list(extra) + [self.trace], capture_output=True, text=True,
                           env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.splitlines()[-1]), pools_of(snap, log, names), r.stderr

    def test_never_freed_goes_to_its_own_pool(self):
        base, pools, err = self.replay(None)
        self.assertEqual(pools, {"a": (0, 0), "keep": (0, 0), "b": (0, 0)})
        self.assertNotIn("XSEG_REPLAY_ORACLE", err)
        summ, pools, err = self.replay("never")
        self.assertEqual((pools["a"], pools["b"]), ((0, 0), (0, 0)))
        self.assertNotIn(pools["keep"], ((0, 0), None))
        self.assertIn("XSEG_REPLAY_ORACLE: 1 allocations (30.0 MiB) to the long-lived pool", err)
        self.assertEqual(summ["peak_allocated_bytes"], base["peak_allocated_bytes"])
        self.assertEqual(summ["failed_allocs"], 0)

    def test_lifetime_threshold(self):
        _, pools, err = self.replay("3")  # a (4 actions) and keep go; b (1 action) stays
        self.assertIn("2 allocations (50.0 MiB)", err)
        self.assertNotIn(pools["keep"], ((0, 0), None))
        self.assertEqual((pools["a"], pools["b"]), (pools["keep"], (0, 0)))
        _, pools, err = self.replay("4")  # a lives exactly 4: not longer, so it stays
        self.assertIn("1 allocations (30.0 MiB)", err)
        self.assertEqual((pools["a"], pools["b"]), ((0, 0), (0, 0)))
        self.assertNotIn(pools["keep"], ((0, 0), None))

    @unittest.skipUnless(emulated(REPLAY), NEEDS_EMU)  # a small device (--device-mem)
    def test_under_pressure_the_pool_gets_the_cache(self):
        # a's 40 MiB stay cached in the default pool; keep's growth in its own pool is refused on a
        # 60 MiB device, and a pool that records cannot reclaim: the oracle trims and retries.
        with open(self.trace, "w") as f:
            f.write("alloc a 40MiB\nfree a\nalloc keep 40MiB\n")
        summ, pools, err = self.replay("never", ["--device-mem", "60M"], ["a", "keep"])
        self.assertEqual(summ["failed_allocs"], 0)
        self.assertIn(pools["a"], ((0, 0), None))  # None: its segment was given back
        self.assertNotIn(pools["keep"], ((0, 0), None))
        self.assertIn("1 allocations (40.0 MiB) to the long-lived pool, 1 retried after a trim, "
                      "0 to the default pool", err)

    def test_mask_file(self):
        # file:PATH routes exactly the listed allocs (a and b, freed), not the never-freed keep.
        mask = os.path.join(self.dir.name, "mask")
        with open(mask, "w") as f:
            f.write("# a predictor's guesses\n0\n\n2\n")
        summ, pools, err = self.replay("file:" + mask)
        self.assertIn("XSEG_REPLAY_ORACLE: 2 allocations (30.0 MiB) to the long-lived pool", err)
        self.assertEqual(pools["keep"], (0, 0))
        self.assertNotIn(pools["a"], ((0, 0), None))
        self.assertEqual(pools["b"], pools["a"])
        self.assertEqual(summ["failed_allocs"], 0)

    def test_bad_mask_file(self):
        mask = os.path.join(self.dir.name, "mask")
        for text, what in (("1\nkeep\n", "mask:2: expected one action index per line"),
                           ("-1\n", "mask:1: expected one action index per line"),
                           ("0\n3\n", "mask:2: that action is not an alloc (the trace has 5 actions)"),
                           ("5\n", "mask:1: index past the trace's last action"),
                           (None, "file:" + mask + ": No such file or directory")):
            if text is None:
                os.unlink(mask)
            else:
                with open(mask, "w") as f:
                    f.write(text)
            env = dict(os.environ, XSEG_REPLAY_ORACLE="file:" + mask)
            r = subprocess.run([REPLAY, "--marks=none", self.trace], capture_output=True, text=True, env=env)
            self.assertNotEqual(r.returncode, 0)
            self.assertNotIn(r.returncode, (-6, -11))
            lines = [l for l in r.stderr.splitlines() if "XSEG_REPLAY_ORACLE" in l]
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn(what, lines[0])

    def test_bad_value(self):
        for v in ("sometimes", "-1", "3x"):
            env = dict(os.environ, XSEG_REPLAY_ORACLE=v)
            r = subprocess.run([REPLAY, "--marks=none", self.trace], capture_output=True, text=True, env=env)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn('XSEG_REPLAY_ORACLE: expected "never", a number of actions or file:PATH', r.stderr)
            self.assertEqual(len([l for l in r.stderr.splitlines() if "XSEG_REPLAY_ORACLE" in l]), 1)

    def test_help_names_it(self):
        r = subprocess.run([REPLAY, "--help"], capture_output=True, text=True)
        self.assertIn("XSEG_REPLAY_ORACLE", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
