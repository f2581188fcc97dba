#!/usr/bin/env python3
"""tools/snapshot2trace.py on hand-made snapshots: seeding, frees, streams, PyTorch's figures,
errors, and the result replayed by xseg-replay.

usage: test_snapshot2trace.py SNAPSHOT2TRACE_PY XSEG_REPLAY
"""
import importlib.util
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

CONVERTER, REPLAY = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("snapshot2trace", CONVERTER)
s2t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s2t)

MiB = 1 << 20


def ev(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}


def snapshot():
    """A 20 MiB segment at 0x1000_0000 holding `pre_live` (alive all along, never in the window)
    and `pre_freed` (allocated before the window, freed in it); the window allocates a, b (on a
    side stream), frees a, and maps a second 20 MiB segment."""
    seg = {"device": 0, "address": 0x10000000, "total_size": 20 * MiB, "allocated_size": 0,
           "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
           "blocks": [{"address": 0x10000000, "size": 4 * MiB, "requested_size": 4 * MiB - 100,
                       "state": "active_allocated", "frames": []},
                      {"address": 0x10400000, "size": 16 * MiB, "requested_size": 0,
                       "state": "inactive", "frames": []}]}
    seg2 = dict(seg, address=0x20000000, stream=0x55,
                blocks=[{"address": 0x20000000, "size": 6 * MiB, "requested_size": 6 * MiB,
                         "state": "active_allocated", "frames": []}])
    events = [
        ev("free_requested", 0x10400000, 2 * MiB),
        ev("free_completed", 0x10400000, 2 * MiB),            # pre_freed
        ev("alloc", 0x10400000, 3 * MiB),                      # a
        ev("segment_alloc", 0x20000000, 20 * MiB, 0x55),
        ev("alloc", 0x20000000, 6 * MiB, 0x55),                # b, on stream 0x55, alive at the end
        ev("free_requested", 0x10400000, 3 * MiB),
        ev("free_completed", 0x10400000, 3 * MiB),             # a
        ev("oom", 0, 0),
    ]
    return {"segments": [seg, seg2], "device_traces": [events],
            "allocator_settings": {"expandable_segments": False, "PYTORCH_CUDA_ALLOC_CONF": ""}}


class Convert(unittest.TestCase):
    def convert(self, snap, device=0):
        out = io.StringIO()
        figures = s2t.convert(snap, device, out, source="hand.pickle")
        return out.getvalue(), figures

    def test_trace_lines(self):
        text, fig = self.convert(snapshot())
        body = [l for l in text.splitlines() if l and not l.startswith("#")]
        self.assertEqual(body[0], "stream s55")
        # Seeds in address order: the live block (requested size), then the pre-window free.
        self.assertEqual(body[1], "alloc pre3 %d" % (4 * MiB - 100))
        self.assertEqual(body[2], "alloc pre0 %d" % (2 * MiB))
        self.assertEqual(body[3], "mark window start (seeded)")
        self.assertEqual(body[4:], ["free pre0", "alloc a1 %d" % (3 * MiB), "alloc a2 %d @s55" % (6 * MiB),
                                    "free a1", "mark end of window"])
        self.assertIn("# the original run hit an OOM here", text)
        # PyTorch's figures: reserved 20 MiB before the window, 40 MiB at peak; allocated counts
        # whole blocks (4 MiB for the live one) and 512-byte-rounded requests.
        self.assertEqual(fig["peak_reserved_bytes"], 40 * MiB)
        self.assertEqual(fig["peak_allocated_bytes"], 4 * MiB + 3 * MiB + 6 * MiB)
        self.assertIn("# pytorch: peak_reserved_bytes=%d" % (40 * MiB), text)

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "only segments"):
            self.convert([{"address": 0}])
        with self.assertRaisesRegex(ValueError, "not a PyTorch memory snapshot"):
            self.convert({"segments": []})
        with self.assertRaisesRegex(ValueError, "device 3 is out of range"):
            self.convert(snapshot(), device=3)

    def test_cli_and_replay(self):
        with tempfile.TemporaryDirectory() as d:
            pk = os.path.join(d, "snap.pickle")
            with open(pk, "wb") as f:
                pickle.dump(snapshot(), f)
            tr = os.path.join(d, "snap.trace")
            with open(tr, "w") as f:
                subprocess.run([sys.executable, CONVERTER, pk], stdout=f, check=True)
            r = subprocess.run([REPLAY, "--no-progress", "--marks=none", "--summary=json", tr],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            s = json.loads(r.stdout)
            self.assertEqual(s["allocs"], 4)
            self.assertEqual(s["frees"], 2)
            self.assertEqual(s["failed_allocs"], 0)
            self.assertGreaterEqual(s["peak_reserved_bytes"], s["peak_allocated_bytes"])
            # A file that is not a pickle: a clear message, exit 1.
            bad = os.path.join(d, "bad.pickle")
            with open(bad, "w") as f:
                f.write("not a pickle")
            r = subprocess.run([sys.executable, CONVERTER, bad], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("snapshot2trace: %s:" % bad, r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
