#!/usr/bin/env python3
"""PyTorch snapshots given to xseg-replay directly, in every layout the tests write themselves:
PyTorch 2.0 (blocks without `address`), 2.1+, data on device 1 only, two devices, OOM events,
CUDA-graph pools, an empty_cache burst; bad files; --device; tools/replay.sh from another folder.

usage: test_snapshot_in.py SNAPSHOT2TRACE_PY XSEG_REPLAY REPLAY_SH
"""
import importlib.util
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import unittest

from replay_driver import NEEDS_EMU, emulated

CONVERTER, REPLAY, REPLAY_SH = sys.argv[1], sys.argv[2], sys.argv[3]
spec = importlib.util.spec_from_file_location("snapshot2trace", CONVERTER)
s2t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s2t)

MiB = 1 << 20


def ev(action, addr, size, stream=0, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}
    e.update(extra)
    return e


def segment(addr, size, blocks, device=0, pool=(0, 0), stream=0):
    return {"device": device, "address": addr, "total_size": size, "stream": stream,
            "segment_type": "large", "segment_pool_id": pool, "is_expandable": False, "frames": [],
            "blocks": blocks}


def block(addr, size, state="active_allocated", requested=None):
    return {"address": addr, "size": size, "requested_size": size if requested is None else requested,
            "state": state, "frames": []}


def replay(path, *args, env=None):
    return subprocess.run([REPLAY, "--no-progress"] + list(args) + [path], capture_output=True, text=True, env=env)


def summaries(stdout):
    return [json.loads(l) for l in stdout.splitlines() if l.startswith("{") and '"mark"' not in l]


def marks(stdout):
    return [json.loads(l) for l in stdout.splitlines() if l.startswith('{"mark"')]


class Base(unittest.TestCase):
    def setUp(self):
        self._d = tempfile.TemporaryDirectory()
        self.dir = self._d.name

    def tearDown(self):
        self._d.cleanup()

    def write(self, name, snap, protocol=4):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            if isinstance(snap, bytes):
                f.write(snap)
            else:
                pickle.dump(snap, f, protocol=protocol)
        return path

    def one_line_error(self, r, want):
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        lines = [l for l in r.stderr.splitlines() if "using the emulator" not in l]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertRegex(lines[0], want)
        self.assertNotIn("Traceback", r.stderr)


class Layouts(Base):
    def test_pt20_blocks_without_address(self):
        """PyTorch 2.0: blocks have no address (they tile the segment in order) and keep the
        request in `history`. The block the window allocated and left live must not be seeded a
        second time, which needs every block's address right."""
        seg_addr = 0x7f0000000000
        blocks = [{"size": 2 * MiB, "state": "inactive", "history": []},
                  {"size": 4 * MiB, "state": "active_allocated",
                   "history": [{"addr": seg_addr + 2 * MiB, "real_size": 4 * MiB - 100, "frames": []}]},
                  {"size": 6 * MiB, "state": "active_allocated",
                   "history": [{"addr": seg_addr + 6 * MiB, "real_size": 6 * MiB, "frames": []}]},
                  {"size": 8 * MiB, "state": "inactive", "history": []}]
        seg = {"device": 0, "address": seg_addr, "total_size": 20 * MiB, "allocated_size": 10 * MiB,
               "active_size": 10 * MiB, "requested_size": 10 * MiB, "stream": 0, "segment_type": "large",
               "blocks": blocks}
        snap = {"segments": [seg], "device_traces": [[ev("alloc", seg_addr + 6 * MiB, 6 * MiB)]]}
        out = io.StringIO()
        fig = s2t.convert(snap, 0, out)
        body = [l for l in out.getvalue().splitlines() if l and not l.startswith("#")]
        self.assertEqual(body, ["alloc pre1 %d" % (4 * MiB - 100), "mark window start (seeded)",
                                "alloc a0 %d" % (6 * MiB), "mark end of window"])
        self.assertEqual(fig["peak_allocated_bytes"], 10 * MiB)
        # xseg-replay reads it straight from the pickle, whatever the file is called.
        path = self.write("pt20.dat", snap, protocol=2)
        r = replay(path, "--marks=none", "--summary=json")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = summaries(r.stdout)
        self.assertEqual(len(s), 1, r.stdout)
        self.assertEqual(s[0]["trace"], "pt20.dat (device 0)")
        self.assertEqual(s[0]["allocs"], 2)
        self.assertEqual(s[0]["failed_allocs"], 0)

    def test_pt20_segments_only(self):
        """A 2.0 file written at an OOM holds segments and one `snapshot` event: its live blocks
        replay as allocations."""
        blocks = [{"size": 512, "state": "active_allocated", "requested_size": 100, "history": []},
                  {"size": 20 * MiB - 512, "state": "active_pending_free", "requested_size": 0,
                   "history": [{"addr": 0x1000 + 512, "real_size": 5 * MiB, "frames": []}]}]
        snap = {"segments": [segment(0x1000, 20 * MiB, blocks)],
                "device_traces": [[{"action": "snapshot", "addr": 0, "size": 0, "stream": 0}]]}
        for b in snap["segments"][0]["blocks"]:
            b.pop("address", None)
        r = replay(self.write("oom20.pickle", snap), "--marks=none", "--summary=json")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = summaries(r.stdout)[0]
        self.assertEqual(s["allocs"], 2)
        self.assertEqual(s["peak_allocated_bytes"], 512 + 5 * MiB)

    def test_unknown_layout(self):
        """A block without an address in a segment without one: one line naming where."""
        snap = {"segments": [{"device": 0, "total_size": MiB, "blocks": [{"size": MiB, "state": "inactive"}]}],
                "device_traces": [[]]}
        r = replay(self.write("odd.pickle", snap))
        self.one_line_error(r, r"^xseg-replay: .*odd.pickle: \['segments'\]\[0\]\['blocks'\]\[0\]: a block "
                               r"without 'address' in a segment without one")


class Devices(Base):
    def two_devices(self, on0=True):
        d0 = [ev("alloc", 0x1000000, 3 * MiB), ev("free_completed", 0x1000000, 3 * MiB)] if on0 else []
        d1 = [ev("segment_alloc", 0x2000000, 20 * MiB), ev("alloc", 0x2000000, 5 * MiB),
              ev("alloc", 0x2500000, 7 * MiB), ev("free_completed", 0x2000000, 5 * MiB)]
        segs = [segment(0x2000000, 20 * MiB, [block(0x2000000, 5 * MiB, "inactive"),
                                               block(0x2500000, 7 * MiB), block(0x2c00000, 8 * MiB, "inactive")],
                        device=1)]
        return {"segments": segs, "device_traces": [d0, d1, [], []]}

    def test_data_on_device1_only(self):
        """Device 0 is empty: the converter takes device 1 (it used to write an empty trace), and
        xseg-replay replays device 1 and only it."""
        snap = self.two_devices(on0=False)
        self.assertEqual(s2t.devices(snap), [1])
        path = self.write("dev1.pickle", snap)
        r = subprocess.run([sys.executable, CONVERTER, path], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(device 1)", r.stdout.splitlines()[0])
        self.assertIn("alloc a1 %d" % (7 * MiB), r.stdout)
        r = replay(path, "--marks=none", "--summary=json")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = summaries(r.stdout)
        self.assertEqual([x["trace"] for x in s], ["dev1.pickle (device 1)"])
        self.assertEqual(s[0]["allocs"], 2)
        self.assertEqual(s[0]["peak_allocated_bytes"], 12 * MiB)
        # Asking for a device without data says so.
        r = subprocess.run([sys.executable, CONVERTER, "--device", "2", path], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("device 2 holds no events and no segments (devices with data: 1)", r.stderr)
        r = replay(path, "--device", "0")
        self.one_line_error(r, r"device 0 holds no events and no segments \(devices with data: 1\)")
        r = subprocess.run([sys.executable, CONVERTER, "--device", "7", path], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("device 7 is out of range", r.stderr)

    @unittest.skipUnless(emulated(REPLAY), NEEDS_EMU)  # each device's smallest device (--min-device)
    def test_two_devices(self):
        path = self.write("two.pickle", self.two_devices())
        r = replay(path, "--marks=none", "--summary=json")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = summaries(r.stdout)
        self.assertEqual([x["trace"] for x in s], ["two.pickle (device 0)", "two.pickle (device 1)"])
        self.assertEqual([x["peak_allocated_bytes"] for x in s], [3 * MiB, 12 * MiB])
        # --compare: a table per device.
        r = replay(path, "--compare")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("== two.pickle (device 0)", r.stdout)
        self.assertIn("== two.pickle (device 1)", r.stdout)
        # --device N: that one only; --check and --min-device see every device too.
        r = replay(path, "--device", "1", "--marks=none", "--summary=json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([x["trace"] for x in summaries(r.stdout)], ["two.pickle (device 1)"])
        r = replay(path, "--check")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len([l for l in r.stdout.splitlines() if ": ok," in l]), 2, r.stdout)
        r = replay(path, "--min-device", "--summary=json", "--device-mem", "1G")
        self.assertEqual(r.returncode, 0, r.stderr)
        got = [json.loads(l) for l in r.stdout.splitlines()]
        self.assertEqual([g["trace"] for g in got], ["two.pickle (device 0)", "two.pickle (device 1)"])
        # The converter alone names the other devices when it picks the first.
        r = subprocess.run([sys.executable, CONVERTER, path], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("holds data on devices 0, 1: converting device 0", r.stderr)
        # --device of a file that is no snapshot: an error naming it.
        tr = os.path.join(self.dir, "t.trace")
        with open(tr, "w") as f:
            f.write("alloc a 1MiB\n")
        r = replay(tr, "--device", "1")
        self.one_line_error(r, "--device 1: no PyTorch snapshot among the traces")


class Events(Base):
    def test_oom_marks(self):
        """PyTorch's OOM event is a mark: each mode's figures where PyTorch failed, with what
        PyTorch saw in its label."""
        events = [ev("segment_alloc", 0x1000000, 40 * MiB), ev("alloc", 0x1000000, 30 * MiB),
                  {"action": "oom", "size": 64 * MiB, "device_free": 3 * MiB, "stream": 0, "time_us": 0}]
        snap = {"segments": [segment(0x1000000, 40 * MiB, [block(0x1000000, 30 * MiB),
                                                            block(0x2e00000, 10 * MiB, "inactive")])],
                "device_traces": [events]}
        r = replay(self.write("oom.pickle", snap), "--compare", "--marks=jsonl", "--summary=none")
        self.assertEqual(r.returncode, 0, r.stderr)
        oom = [m for m in marks(r.stdout) if m["mark"].startswith("PyTorch OOM")]
        self.assertEqual(len(oom), 2, r.stdout)  # one per mode
        self.assertEqual(oom[0]["mark"], "PyTorch OOM: 64.0 MiB request, 3.0 MiB free; PyTorch had "
                                         "30.0 MiB allocated, 40.0 MiB reserved")
        self.assertEqual({m["mode"] for m in oom}, {"classic", "expandable"})
        for m in oom:
            self.assertEqual(m["allocated_bytes.all.current"], 30 * MiB)

    def graph_pool_snapshot(self, pool):
        """A 20 MiB block allocated and freed in a segment of @p pool, then a 20 MiB request in
        the default pool (a segment of its own in the file)."""
        events = [ev("segment_alloc", 0x10000000, 20 * MiB), ev("alloc", 0x10000000, 20 * MiB),
                  ev("free_completed", 0x10000000, 20 * MiB),
                  ev("segment_alloc", 0x20000000, 20 * MiB), ev("alloc", 0x20000000, 20 * MiB)]
        segs = [segment(0x10000000, 20 * MiB, [block(0x10000000, 20 * MiB, "inactive")], pool=pool),
                segment(0x20000000, 20 * MiB, [block(0x20000000, 20 * MiB)])]
        return {"segments": segs, "device_traces": [events]}

    def test_graph_pools(self):
        """Allocations in a CUDA graph's segments go to a private pool, whose cached memory the
        default pool cannot reuse: classic reserves both segments, as PyTorch did."""
        peaks = {}
        for pool in ((0, 0), (1, 0)):
            snap = self.graph_pool_snapshot(pool)
            out = io.StringIO()
            s2t.convert(snap, 0, out)
            text = out.getvalue()
            self.assertEqual("pool_begin g1_0" in text, pool != (0, 0))
            r = replay(self.write("g%d.pickle" % pool[0], snap), "--config", "expandable_segments:False",
                       "--marks=none", "--summary=json")
            self.assertEqual(r.returncode, 0, r.stderr)
            peaks[pool] = summaries(r.stdout)[0]["peak_reserved_bytes"]
        self.assertEqual(peaks[(0, 0)], 20 * MiB)
        self.assertEqual(peaks[(1, 0)], 40 * MiB)
        body = [l for l in text.splitlines() if l and not l.startswith("#")]
        self.assertEqual(body[1:5], ["pool_begin g1_0", "alloc a0 %d" % (20 * MiB), "free a0", "pool_end g1_0"])

    def test_empty_cache_burst(self):
        """Two segment frees in a row were an empty_cache(): replayed as one, so the cache is given
        back there; a single segment free is not one."""
        def snap(nfree):
            events = [ev("segment_alloc", 0x10000000, 30 * MiB), ev("alloc", 0x10000000, 30 * MiB),
                      ev("segment_alloc", 0x20000000, 30 * MiB), ev("alloc", 0x20000000, 30 * MiB),
                      ev("free_completed", 0x10000000, 30 * MiB), ev("free_completed", 0x20000000, 30 * MiB)]
            events += [ev("segment_free", 0x10000000 * (i + 1), 30 * MiB) for i in range(nfree)]
            events += [ev("segment_alloc", 0x30000000, 2 * MiB), ev("alloc", 0x30000000, 512)]
            return {"segments": [segment(0x30000000, 2 * MiB, [block(0x30000000, 512)])]
                    + [segment(0x20000000, 30 * MiB, [block(0x20000000, 30 * MiB, "inactive")])] * (2 - nfree),
                    "device_traces": [events]}
        for nfree, want in ((2, 2 * MiB), (1, 62 * MiB)):
            r = replay(self.write("ec%d.pickle" % nfree, snap(nfree)), "--config", "expandable_segments:False",
                       "--marks=jsonl", "--summary=none")
            self.assertEqual(r.returncode, 0, r.stderr)
            end = [m for m in marks(r.stdout) if m["mark"] == "end of window"][0]
            self.assertEqual(end["reserved_bytes.all.current"], want, nfree)


class BadInput(Base):
    def test_hostile_and_truncated(self):
        good = pickle.dumps({"segments": [], "device_traces": [[ev("alloc", 0x1000, 512)]]}, protocol=4)
        cases = [("trunc.pickle", good[:-9], r"truncated"),
                 ("evil.pickle", b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.", r"refused: opcode STACK_GLOBAL"),
                 ("proto9.pickle", b"\x80\x09N.", r"protocol 9"),
                 ("list.pickle", pickle.dumps([{"address": 0}]), r"holds only segments"),
                 ("nodev.pickle", pickle.dumps({"segments": [], "device_traces": [[], []]}),
                  r"holds no events and no segments on any device"),
                 ("deep.pickle", b"\x80\x02" + b"]" * 5000 + b"a" * 4999 + b".", r"nested more than 1000 deep")]
        for name, data, want in cases:
            path = self.write(name, data)
            r = replay(path, "--compare")
            self.one_line_error(r, r"^xseg-replay: .*%s: .*%s" % (name, want))

    def test_without_python(self):
        """python3 missing: one line saying what the snapshot needs; traces still replay."""
        path = self.write("s.pickle", {"segments": [], "device_traces": [[ev("alloc", 0x1000, 512)]]})
        env = dict(os.environ, PATH=self.dir)
        r = replay(path, env=env)
        self.one_line_error(r, r"s.pickle is a PyTorch snapshot; reading it needs python3 \(not found in PATH\)")
        tr = os.path.join(self.dir, "plain.pickle")
        with open(tr, "w") as f:
            f.write("alloc a 1MiB\nfree a\n")  # the name says pickle, the first byte says trace
        r = replay(tr, "--marks=none", "--summary=json", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(summaries(r.stdout)[0]["allocs"], 1)


class Report(Base):
    def test_report_finds_the_frames(self):
        """--report without --history: the largest live allocations at the peak show the frames
        the pickle holds, of a block alive before the window (seeded from the segment's block)
        and of an allocation in device_traces."""
        seg_addr = 0x7f0000000000

        def frames(fn, line, name):
            return [{"filename": fn, "line": line, "name": name},
                    {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"}]

        seeded = block(seg_addr, 64 * MiB)
        seeded["frames"] = frames("embed.py", 31, "build_table")
        seg = segment(seg_addr, 64 * MiB, [seeded])
        alloc = ev("alloc", 0x7e0000000000, 32 * MiB, frames=frames("attn.py", 77, "forward"))
        path = self.write("frames.pickle", {"segments": [seg], "device_traces": [[alloc]]})
        page = os.path.join(self.dir, "out.html")
        r = replay(path, "--report", page, "--tune-budget", "2runs", "--marks=none")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(page, encoding="utf-8") as f:
            html = f.read()
        live = html[html.index('<table class="live">'):]
        live = live[:live.index("</table>")]
        self.assertIn("embed.py:31 build_table", live)
        self.assertIn("attn.py:77 forward", live)
        self.assertNotIn("no frames", live)

    def recorded_mode_page(self, name, expandable_settings, is_expandable, map_events=False):
        """A snapshot of a fragmenting window (64 MiB pieces freed, then 96 MiB requests) whose
        recording reserved 3 segments' worth; its --report page."""
        act = "segment_map" if map_events else "segment_alloc"
        evs = []
        for i in range(3):
            a = 0x7f0000000000 + i * (1 << 30)
            evs += [ev(act, a, 160 * MiB), ev("alloc", a, 64 * MiB), ev("alloc", a + 64 * MiB, 96 * MiB)]
        for i in range(3):
            evs.append(ev("free_completed", 0x7f0000000000 + i * (1 << 30), 64 * MiB))
        segs = []
        for i in range(3):
            seg = segment(0x7f0000000000 + i * (1 << 30), 160 * MiB,
                          [block(0x7f0000000000 + i * (1 << 30) + 64 * MiB, 96 * MiB)])
            seg["is_expandable"] = is_expandable
            segs.append(seg)
        snap = {"segments": segs, "device_traces": [evs]}
        if expandable_settings is not None:
            snap["allocator_settings"] = {"expandable_segments": expandable_settings, "PYTORCH_CUDA_ALLOC_CONF": ""}
        path = self.write(name, snap)
        page = os.path.join(self.dir, name + ".html")
        r = replay(path, "--report", page, "--tune-budget", "2runs", "--marks=none")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(page, encoding="utf-8") as f:
            return f.read()

    def test_report_compares_like_with_like(self):
        """A recording made with expandable_segments:True (its settings, or without settings its
        expandable segments, or its segment_map events) is compared with the expandable replay,
        never with classic mode as if the gap were model error; a classic recording keeps the
        classic comparison. The page says which mode PyTorch ran in."""
        for how, args in (("settings", (True, True)), ("segments", (None, True)), ("events", (None, None, True))):
            with self.subTest(how=how):
                html = self.recorded_mode_page("exp-%s.pickle" % how, *args)
                self.assertIn('data-recorded-mode="expandable"', html)
                self.assertIn("compared with the expandable replay", html)
                verdict = html[html.index('<div class="verdict'):]
                verdict = verdict[:verdict.index("</div>")]
                self.assertNotIn("Classic mode", verdict)
                self.assertIn("PyTorch (recorded, expandable)", html)
        html = self.recorded_mode_page("classic.pickle", False, False)
        self.assertIn('data-recorded-mode="classic"', html)
        self.assertIn("PyTorch (recorded, classic)", html)
        self.assertIn("Classic mode", html[html.index('<div class="verdict'):])


def left_in(tmp):
    """What a run left in TMPDIR, less ThreadSanitizer's own file: its runtime creates
    tsan.rodata.<pid> in TMPDIR as each instrumented process starts and unlinks it a moment later,
    so a SIGTERM that lands in between (the replay stage signals just as the child starts) leaves
    it. The runtime's file says nothing of xseg-replay's cleanup; any other name does."""
    return sorted(f for f in os.listdir(tmp) if not re.fullmatch(r"tsan\.rodata\.[0-9]+", f))


class Cleanup(Base):
    @unittest.skipUnless(emulated(REPLAY), NEEDS_EMU)  # --min-device: a run long enough to signal
    def test_converted_traces_go(self):
        """The converted traces live in a folder of TMPDIR while xseg-replay runs: gone after a
        run, after a failure, and when a signal ends it (during the conversion or a replay)."""
        tmp = os.path.join(self.dir, "tmp")
        os.mkdir(tmp)
        env = dict(os.environ, TMPDIR=tmp)
        events = [ev("alloc", 0x10000000 + i * 2 * MiB, 2 * MiB) for i in range(4000)]
        path = self.write("many.pickle", {"segments": [], "device_traces": [events]})
        r = replay(path, "--marks=none", "--summary=none", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(os.listdir(tmp), [])
        bad = self.write("bad.pickle", b"\x80\x04N")
        r = replay(bad, env=env)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(os.listdir(tmp), [])
        import signal
        import time
        for stage in ("conversion", "replay"):
            p = subprocess.Popen([REPLAY, "--no-progress", "--min-device", "--compare", path], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while p.poll() is None and time.monotonic() < deadline:
                done = any(f.endswith(".trace") for _, _, fs in os.walk(tmp) for f in fs)
                if done and (stage == "conversion" or
                             subprocess.run(["pgrep", "-P", str(p.pid), "-x", "xseg-replay"],
                                            capture_output=True).returncode == 0):
                    break
                time.sleep(0.01)
            p.send_signal(signal.SIGTERM)
            p.wait()
            self.assertIn(p.returncode, (-signal.SIGTERM, 0), stage)
            self.assertEqual(left_in(tmp), [], stage)


class ReplaySh(Base):
    def test_relative_paths_are_the_callers(self):
        """tools/replay.sh builds in the checkout and replays in the caller's folder: a relative
        snapshot and --plot out.svg are the caller's."""
        self.write("rel.pickle", {"segments": [], "device_traces": [[ev("alloc", 0x1000, MiB)]]})
        build = os.path.dirname(os.path.dirname(os.path.abspath(REPLAY)))
        r = subprocess.run(["bash", REPLAY_SH, "--no-progress", "--marks=none", "--plot", "out.svg", "rel.pickle"],
                           cwd=self.dir, capture_output=True, text=True, env=dict(os.environ, XSEG_BUILD_DIR=build))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "out.svg")), r.stderr)
        self.assertIn("rel.pickle (device 0)", r.stdout)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
