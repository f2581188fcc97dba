#!/usr/bin/env python3
"""tools/snapshot2trace.py on hand-made snapshots: seeding, frees, streams, PyTorch's figures,
errors, the result replayed by xseg-replay, and a reader that stops reading (`| head`).

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
                                    "free a1", "mark PyTorch OOM: 0.0 MiB request, free unknown; PyTorch "
                                    "had 10.0 MiB allocated, 40.0 MiB reserved", "mark end of window"])
        # PyTorch's figures: reserved 20 MiB before the window, 40 MiB at peak; allocated counts
        # whole blocks (4 MiB for the live one) and 512-byte-rounded requests.
        self.assertEqual(fig["peak_reserved_bytes"], 40 * MiB)
        self.assertEqual(fig["peak_allocated_bytes"], 4 * MiB + 3 * MiB + 6 * MiB)
        self.assertIn("# pytorch: peak_reserved_bytes=%d" % (40 * MiB), text)
        # An OOM without device_free: the device it happened on is unknown (0).
        self.assertIn("# pytorch: oom_device_bytes=0\n", text)

    def test_oom_request_and_device(self):
        """The request PyTorch failed is replayed (and freed) after the OOM mark, on its stream; the
        device is PyTorch's reserved bytes at the first OOM plus the free bytes it reported."""
        snap = snapshot()
        snap["device_traces"][0][-1] = {"action": "oom", "size": 64 * MiB, "device_free": 3 * MiB,
                                        "stream": 0x55, "time_us": 0}
        text, fig = self.convert(snap)
        body = [l for l in text.splitlines() if l and not l.startswith("#")]
        i = [j for j, l in enumerate(body) if l.startswith("mark PyTorch OOM")][0]
        self.assertEqual(body[i + 1:i + 3], ["alloc oom1 %d @s55  # the request PyTorch could not serve" % (64 * MiB),
                                             "free oom1"])
        self.assertIn("# pytorch: oom_device_bytes=%d\n" % (40 * MiB + 3 * MiB), text)
        self.assertEqual(fig["peak_allocated_bytes"], 4 * MiB + 3 * MiB + 6 * MiB)  # PyTorch's, without it
        no_oom = snapshot()
        no_oom["device_traces"][0].pop()
        self.assertNotIn("oom_device_bytes", self.convert(no_oom)[0])

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

    def test_reader_goes_away(self):
        """`snapshot2trace.py big.pickle | head`: the converter stops quietly (exit 141, as a
        program killed by SIGPIPE), without a traceback."""
        with tempfile.TemporaryDirectory() as d:
            pk = os.path.join(d, "big.pickle")
            # About 500 KB of trace: more than a pipe holds, so the converter is still writing.
            events = [ev("alloc", 0x10000000 + i * 512, 512) for i in range(20000)]
            with open(pk, "wb") as f:
                pickle.dump({"segments": [], "device_traces": [events]}, f)
            p = subprocess.Popen([sys.executable, CONVERTER, pk], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            first = p.stdout.readline()
            p.stdout.close()
            err = p.stderr.read()
            p.stderr.close()
            self.assertEqual(p.wait(), 141, err)
            self.assertTrue(first.startswith(b"# xseg-replay trace"), first)
            self.assertEqual(err, b"")


def run_cli(path, *args):
    return subprocess.run([sys.executable, CONVERTER, path] + list(args), capture_output=True, text=True)


def one_line_error(test, r, path, want):
    """The converter failed cleanly: exit 1, one stderr line naming the file, no traceback."""
    test.assertEqual(r.returncode, 1, r.stderr)
    test.assertEqual(r.stdout, "")
    lines = r.stderr.splitlines()
    test.assertEqual(len(lines), 1, r.stderr)
    test.assertTrue(lines[0].startswith("snapshot2trace: %s: " % path), lines[0])
    test.assertRegex(lines[0], want)
    test.assertNotIn("Traceback", r.stderr)


class Reader(unittest.TestCase):
    """The pickle reader: plain data in every protocol, nothing that names or calls code."""

    def test_plain_data_every_protocol(self):
        shared = [1, 2]
        values = [None, True, False, 0, 255, 65536, -2**31, 2**63, 2**64 - 1, -2**64, 1.5, "",
                  "é€😀", "x" * 300, b"abc", (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], {},
                  {"a": 1, 2: "b", (1, 2): [3]}, [shared, shared], snapshot()]
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            for v in values:
                if isinstance(v, bytes) and proto < 3:
                    continue  # bytes need a global (codecs.encode) before protocol 3
                got = s2t.load_snapshot(pickle.dumps(v, protocol=proto))
                self.assertEqual(got, v, (proto, v))
                self.assertIs(type(got), type(v))
            got = s2t.load_snapshot(pickle.dumps([shared, shared], protocol=proto))
            self.assertIs(got[0], got[1])  # the memo keeps shared references shared

    def test_refuses_code(self):
        """Every way a pickle can name or call a function is refused before anything runs."""
        class Evil:
            def __reduce__(self):
                return (eval, ("1+1",))
        crafted = [pickle.dumps(Evil(), protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)]
        crafted += [
            b"cbuiltins\neval\n(S'1+1'\ntR.",                  # GLOBAL + REDUCE, protocol 0
            b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.",      # STACK_GLOBAL
            b"\x80\x02cbuiltins\ngetattr\nq\x00.",             # a global alone
            b"(cos\nsystem\nS'true'\no.",                      # OBJ
            b"(S'true'\nios\nsystem\n.",                       # INST
            b"\x80\x02}b.",                                    # BUILD (calls __setstate__)
            b"\x80\x02\x82\x01.",                              # EXT1 (the copyreg registry)
            b"P0\n.",                                          # PERSID
        ]
        for data in crafted:
            with self.assertRaisesRegex(s2t.SnapshotError, "refused: opcode [A-Z_0-9]+ would import or call code"):
                s2t.load_snapshot(data)

    def test_malformed_pickles(self):
        good = pickle.dumps(snapshot(), protocol=4)
        # Every truncation of a real snapshot: a SnapshotError, never another exception.
        for n in range(0, len(good), 7):
            with self.assertRaises(s2t.SnapshotError):
                s2t.load_snapshot(good[:n])
        cases = {
            b"": "truncated",
            b"\x80\x09N.": "protocol 9",
            b"\xff": "unknown pickle opcode 0xff",
            b"a.": "stack underflow",
            b"NN.": "STOP with 2 items",
            b"\x80\x02h\x05.": "memo entry 5 used before it was stored",
            b"\x80\x02\x8b\x00\x00\x00\x40" + b"\x01" * 8 + b".": "integer of 1073741824 bytes",
            b"L" + b"9" * 5000 + b"\n.": "longer than 40 digits",
            b"\x80\x04\x8d" + (1 << 60).to_bytes(8, "little") + b"x.": "truncated",
            b"\x80\x02}](s.": "stack underflow",
            b"\x80\x02}]]s.": "a list used as a dict key",
            b"\x80\x02NK\x01a.": "APPEND to a NoneType",
            b"(.": "STOP with 0 items",
            b"\x80\x02X\x02\x00\x00\x00\xff\xfe.": "not valid UTF-8",
        }
        for data, want in cases.items():
            with self.assertRaisesRegex(s2t.SnapshotError, want, msg=data[:20]):
                s2t.load_snapshot(data)

    def test_bombs(self):
        # A memo index of 2^32-1 costs one entry, not a 32 GiB table.
        self.assertEqual(s2t.load_snapshot(b"\x80\x02Nr\xff\xff\xff\xff0j\xff\xff\xff\xff."), None)
        # Many empty containers from one byte each: the memory estimate stops it.
        bomb = b"\x80\x02]" + b"}a" * 200000 + b"."
        with self.assertRaisesRegex(s2t.SnapshotError, "memory limit"):
            s2t.load_snapshot(bomb, max_memory=4 << 20)
        # The stack is bounded too (values pushed and never consumed).
        with self.assertRaisesRegex(s2t.SnapshotError, "items on the pickle stack"):
            s2t.load_snapshot(b"N" * ((1 << 20) + 10) + b".")
        # One segment referenced a million times from a few bytes: convert refuses to expand it.
        seg = {"device": 0, "address": 0, "total_size": 512, "stream": 0,
               "blocks": [{"address": 0, "size": 512, "state": "active_allocated"}] * 1000}
        snap = {"device_traces": [[]], "segments": [seg] * 1000}
        data = pickle.dumps(snap, protocol=4)
        self.assertLess(len(data), 20000)
        with self.assertRaisesRegex(s2t.SnapshotError, "over and over"):
            s2t.convert(s2t.load_snapshot(data), 0, io.StringIO(), work_limit=len(data))

    def test_malformed_snapshots(self):
        """Wrong types or ranges inside a well-formed pickle: one message naming where."""
        def bad(mutate, want):
            snap = snapshot()
            mutate(snap)
            with self.assertRaisesRegex(s2t.SnapshotError, want):
                s2t.convert(snap, 0, io.StringIO(), source="x")
        bad(lambda s: s.update(device_traces=5), r"\['device_traces'\]: expected a list")
        bad(lambda s: s["device_traces"][0].append([1]), r"\['device_traces'\]\[0\]\[8\]: expected a dict, found list")
        bad(lambda s: s["device_traces"][0][2].update(addr="0x10"), r"\['addr'\]: expected an integer")
        bad(lambda s: s["device_traces"][0][2].update(size=-5), r"\['size'\]: expected an integer .* found -5")
        bad(lambda s: s["device_traces"][0][2].update(size=2**64), r"expected an integer in \[0, 2\^64\)")
        bad(lambda s: s["device_traces"][0][2].pop("addr"), r"\[2\]: missing 'addr'")
        bad(lambda s: s["segments"][0]["blocks"].append(None), r"\['blocks'\]\[2\]: expected a dict")
        bad(lambda s: s["segments"][0].pop("total_size"), r"\['segments'\]\[0\]: missing 'total_size'")
        bad(lambda s: s["segments"][0].update(device=[0]), r"\['device'\]: expected an integer")
        # A crafted setting cannot add lines to the trace.
        snap = snapshot()
        snap["allocator_settings"] = {"expandable_segments": "x\nalloc evil 1TiB", "PYTORCH_CUDA_ALLOC_CONF": ["y"]}
        out = io.StringIO()
        s2t.convert(snap, 0, out)
        self.assertNotIn("\nalloc evil", out.getvalue())

    def test_cli_refuses_code_without_running_it(self):
        with tempfile.TemporaryDirectory() as d:
            flag = os.path.join(d, "ran")

            class Evil:
                def __reduce__(self):
                    return (os.system, ("touch " + flag,))
            for proto in (0, 2, 4, 5):
                pk = os.path.join(d, "evil%d.pickle" % proto)
                with open(pk, "wb") as f:
                    pickle.dump({"device_traces": [[]], "x": Evil()}, f, protocol=proto)
                one_line_error(self, run_cli(pk), pk, "refused: opcode")
                self.assertFalse(os.path.exists(flag), "the crafted pickle ran a command")
            for name, data in [("trunc.pickle", pickle.dumps(snapshot())[:-40]),
                               ("empty.pickle", b""),
                               ("list.pickle", pickle.dumps({"device_traces": [[{"action": "alloc"}]]}))]:
                pk = os.path.join(d, name)
                with open(pk, "wb") as f:
                    f.write(data)
                one_line_error(self, run_cli(pk), pk, "truncated|missing 'addr'")
            one_line_error(self, run_cli(os.path.join(d, "absent.pickle")),
                           os.path.join(d, "absent.pickle"), "No such file")
            one_line_error(self, run_cli(d), d, "Is a directory")
            pk = os.path.join(d, "big.pickle")
            with open(pk, "wb") as f:
                f.write(b"\x80\x02]" + b"}a" * 300000 + b".")
            one_line_error(self, run_cli(pk, "--max-memory-mib", "1"), pk, "memory limit")


class Nesting(unittest.TestCase):
    """Deeply nested data: Python's hash() of a tuple recurses in C, so a million-deep tuple used
    as a dict key once ended the converter with SIGSEGV. Nesting is bounded (MAX_DEPTH)."""

    def test_million_deep_key_cli(self):
        # 1 MB: EMPTY_DICT, an empty tuple wrapped a million times by TUPLE1, as a key of None.
        data = b"\x80\x02}" + b")" + b"\x85" * 1000000 + b"Ns."
        self.assertGreaterEqual(len(data), 1000000)
        with tempfile.TemporaryDirectory() as d:
            pk = os.path.join(d, "deep.pickle")
            with open(pk, "wb") as f:
                f.write(data)
            r = run_cli(pk)
            self.assertGreaterEqual(r.returncode, 0, "killed by signal %d" % -r.returncode)
            one_line_error(self, r, pk, "nested more than 1000 deep")
            # The same nesting in a list (never hashed) and a frozenset: refused alike.
            for body in (b"]" * 1000001 + b"a" * 1000000, b"(" * 1001 + b"\x91" * 1001):
                with open(pk, "wb") as f:
                    f.write(b"\x80\x04" + body + b".")
                one_line_error(self, run_cli(pk), pk, "nested more than 1000 deep")

    def test_bound(self):
        M = s2t.MAX_DEPTH
        self.assertEqual(M, 1000)
        # Exactly MAX_DEPTH levels load; one more is refused, for keys, lists and dicts.
        key = s2t.load_snapshot(b"\x80\x02}" + b")" + b"\x85" * (M - 1) + b"Ns.")
        self.assertEqual(len(key), 1)
        with self.assertRaisesRegex(s2t.SnapshotError, "nested more than 1000 deep"):
            s2t.load_snapshot(b"\x80\x02}" + b")" + b"\x85" * M + b"Ns.")
        lst = b"\x80\x02" + b"]" * M + b"a" * (M - 1) + b"."
        self.assertIsInstance(s2t.load_snapshot(lst), list)
        with self.assertRaisesRegex(s2t.SnapshotError, "nested more than 1000 deep"):
            s2t.load_snapshot(b"\x80\x02" + b"]" * (M + 1) + b"a" * M + b".")
        with self.assertRaisesRegex(s2t.SnapshotError, "nested more than 1000 deep"):
            s2t.load_snapshot(b"\x80\x02" + b"}K\x01" * M + b"}" + b"s" * M + b".")
        # Shared through the memo: l[i+1] = [l[i], l[i]] (2^999 paths) is walked once per list,
        # and counted at its real depth.
        def shared(levels):
            data = b"\x80\x04]"
            for i in range(levels):  # MEMOIZE l[i], POP, MARK, BINGET it twice, LIST
                data += b"\x940(" + (b"j" + i.to_bytes(4, "little")) * 2 + b"l"
            return data + b"."
        self.assertIsInstance(s2t.load_snapshot(shared(M - 1)), list)
        with self.assertRaisesRegex(s2t.SnapshotError, "nested more than 1000 deep"):
            s2t.load_snapshot(shared(M))
        # A list that holds itself.
        with self.assertRaisesRegex(s2t.SnapshotError, "contains itself"):
            s2t.load_snapshot(b"\x80\x02]\x94h\x00a.")
        # After all that the reader still reads a snapshot.
        self.assertEqual(s2t.load_snapshot(pickle.dumps(snapshot(), protocol=4)), snapshot())


class Frames(unittest.TestCase):
    """Frame names from the snapshot as the trace language reads them back."""

    HOSTILE = ["#starts_with_hash", "a #comment", "line\nbreak\nalloc evil 1TiB", "tab\there",
               "  spaces  around ", "nul\0inside", "cr\rlf", "\udcff\udcfe non-utf8", "\ud800lone",
               "", "#", " # ", "\t#x", "%41 percent", "é€😀"]

    def snapshot_with_frames(self):
        snap = snapshot()
        frames = []
        for i, n in enumerate(self.HOSTILE):
            frames.append({"filename": n, "name": n, "line": i})
        events = snap["device_traces"][0]
        events[2]["frames"] = frames
        events[4]["frames"] = frames[::-1]
        snap["segments"][0]["blocks"][0]["frames"] = [{"filename": "-", "name": "#", "line": 1}]
        return snap

    def test_hostile_names_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            pk = os.path.join(d, "frames.pickle")
            with open(pk, "wb") as f:
                pickle.dump(self.snapshot_with_frames(), f, protocol=4)
            tr = os.path.join(d, "frames.trace")
            with open(tr, "wb") as f:
                r = subprocess.run([sys.executable, CONVERTER, pk], stdout=f, stderr=subprocess.PIPE,
                                   env=dict(os.environ, PYTHONIOENCODING="ascii"))
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(tr, "rb") as f:
                text = f.read()
            self.assertNotIn(b"\nalloc evil", text)
            frame_lines = [l for l in text.split(b"\n") if l.startswith(b"frame ")]
            self.assertEqual(len(frame_lines), 2 * len(self.HOSTILE) + 1)
            r = subprocess.run([REPLAY, "--check", tr], capture_output=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            # Replayed with history, the snapshot shows every frame: names sanitized, file names
            # as their bytes (a non-UTF-8 name's surrogates are its bytes again).
            snapf = os.path.join(d, "out.pickle")
            r = subprocess.run([REPLAY, "--no-progress", "--marks=none", "--history", "--snapshot", snapf, tr],
                               capture_output=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(snapf, "rb") as f:
                out = pickle.load(f)
            got = [fr for e in out["device_traces"][0] if e.get("action") == "alloc" for fr in e.get("frames", [])]
            files = {fr["filename"] for fr in got}
            for n in self.HOSTILE:
                if "\0" in n:
                    n = n[:n.index("\0")]  # xseg keeps C strings
                if n.startswith("\udcff"):
                    continue  # raw non-UTF-8 bytes
                # xseg's writer shows each byte of invalid UTF-8 (a surrogate's too) as '?'
                n = "".join("???" if 0xD800 <= ord(c) <= 0xDFFF else c for c in n)
                self.assertIn(n, files)
            names = {fr["name"] for fr in got}
            self.assertIn("?starts_with_hash", names)
            self.assertIn("line break alloc evil 1TiB", names)
            self.assertIn("nul inside", names)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
