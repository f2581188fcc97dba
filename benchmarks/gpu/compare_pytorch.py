#!/usr/bin/env python3
"""Replay xseg-replay traces through PyTorch with real tensors, under each allocator, and print
one table: peak allocated, peak reserved, utilization, host time per allocation, the allocator's
synchronizations of every stream (num_sync_all_streams) and, with --min-fraction, the smallest
set_per_process_memory_fraction at which the trace still runs without a failed allocation.

Allocators (each in its own subprocess, which replays every trace in turn with the cache
emptied and the peaks reset between them: PyTorch fixes its allocator at first CUDA use):
  native        PyTorch's caching allocator, expandable_segments:False
  native-exp    PyTorch's caching allocator, expandable_segments:True
  async         backend:cudaMallocAsync
  xseg          libxseg installed by xseg.torch.enable("expandable_segments:True"), every hook
                wired (record_stream, empty_cache, ...)
  xseg-classic  the same with enable("expandable_segments:False")

For xseg the figures come from the xseg package (xseg.memory_stats, the same keys as
torch.cuda.memory_stats). The package is taken from the source tree beside this script
(python/xseg), with libxseg from --lib.

Each `alloc NAME SIZE [@s]` becomes torch.empty(SIZE, dtype=torch.uint8) on that stream, `free`
drops the tensor, `record` is Tensor.record_stream, `sync` synchronizes, `empty_cache` calls
torch.cuda.empty_cache(), `config` applies the text to the allocator under test (PyTorch's
_set_allocator_settings, or xseg.set_config). `hold`/`release` (emulator-only) are ignored; pool and capture
actions are not supported yet.

--min-fraction bisects the fraction between peak allocated and the uncapped peak reserved (of
the device's total), replaying the trace under each cap (--fraction-steps times); --budget stops
the search (not the first replay) when a mode's share of the seconds is spent. Traces may be
gzipped (NAME.trace.gz, as benchmarks/gpu/prepare.sh writes them).

With --json the rows come allocator by allocator, as each finishes.

usage: compare_pytorch.py --lib build/libxseg.so TRACE... [--modes native,xseg,...]
       compare_pytorch.py --backend fake TRACE      (no GPU, no torch: checks the replay logic;
                                                     its device has 80 GiB)
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time

from xseg_source import import_xseg  # beside this script

MODES = ["native", "native-exp", "async", "xseg", "xseg-classic"]
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
         "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40,
         "TIB": 1 << 40}
SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([A-Za-z]*)$")


class TraceError(ValueError):
    pass


def parse_size(text, where):
    m = SIZE_RE.match(text)
    if not m or m.group(2).upper() not in UNITS:
        raise TraceError("%s: bad size '%s'" % (where, text))
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def parse_trace(path):
    """The trace language as a list of (line, verb, args) tuples; raises TraceError naming the
    line. (xseg-replay --check validates more thoroughly.)"""
    actions = []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for n, raw in enumerate(f, 1):
            line = re.sub(r"(^|\s)#.*$", "", raw).strip()
            if not line:
                continue
            verb, _, rest = line.partition(" ")
            where = "%s:%d" % (path, n)
            args = rest.split()
            if verb == "alloc":
                if len(args) not in (2, 3):
                    raise TraceError("%s: alloc NAME SIZE [@STREAM]" % where)
                actions.append((n, "alloc", (args[0], parse_size(args[1], where),
                                              args[2][1:] if len(args) == 3 else None)))
            elif verb in ("free", "stream"):
                actions.append((n, verb, (args[0],)))
            elif verb == "record":
                actions.append((n, "record", (args[0], args[1][1:])))
            elif verb == "sync":
                actions.append((n, "sync", (args[0][1:] if args else None,)))
            elif verb in ("hold", "release"):
                actions.append((n, verb, (args[0][1:],)))
            elif verb == "empty_cache":
                actions.append((n, "empty_cache", ()))
            elif verb in ("config", "mark"):
                actions.append((n, verb, (rest.strip(),)))
            elif verb in ("pool_begin", "pool_end", "pool_release", "capture_begin", "capture_end"):
                raise TraceError("%s: %s: not supported yet: private pools are a later issue" % (where, verb))
            else:
                raise TraceError("%s: unknown action '%s'" % (where, verb))
    return actions


class FakeBackend:
    """Counts bytes like an allocator that reserves exactly what is live (no GPU, no torch), on a
    device of TOTAL bytes with a memory fraction like PyTorch's."""

    TOTAL = 80 << 30

    def __init__(self):
        self.live = 0
        self.peak = 0
        self.cap = self.TOTAL
        self.syncs = 0

    def total_memory(self):
        return self.TOTAL

    def set_fraction(self, fraction):
        self.cap = int(fraction * self.TOTAL)

    def reset(self):
        self.peak = self.live
        self.syncs = 0

    def new_stream(self):
        return object()

    def empty(self, size, stream):
        if self.live + size > self.cap:
            raise RuntimeError("out of memory (fake device: %d bytes live, cap %d)" % (self.live, self.cap))
        self.live += size
        self.peak = max(self.peak, self.live)
        return ("tensor", size)

    def drop(self, tensor):
        self.live -= tensor[1]

    def record(self, tensor, stream):
        pass

    def sync(self, stream):
        pass

    def empty_cache(self):
        pass

    def set_config(self, text):
        pass

    def stats(self):
        return {"allocated_bytes.all.peak": self.peak, "reserved_bytes.all.peak": self.peak,
                "allocated_bytes.all.current": self.live, "reserved_bytes.all.current": self.live,
                "num_sync_all_streams": self.syncs, "num_device_alloc": None, "num_device_free": None}


XSEG_CONFIG = {"xseg": "expandable_segments:True", "xseg-classic": "expandable_segments:False"}


class TorchBackend:
    def __init__(self, mode, lib):
        import torch
        self.torch = torch
        self.xseg = None
        if mode.startswith("xseg"):
            # Before PyTorch's first CUDA allocation: PyTorch fixes its allocator then.
            self.xseg = import_xseg(lib)
            self.xseg.torch.enable(XSEG_CONFIG[mode])
        self.mode = mode
        torch.cuda.init()

    def new_stream(self):
        return self.torch.cuda.Stream()

    def empty(self, size, stream):
        with self.torch.cuda.stream(stream) if stream is not None else _null():
            return self.torch.empty(size, dtype=self.torch.uint8, device="cuda")

    def drop(self, tensor):
        del tensor

    def record(self, tensor, stream):
        tensor.record_stream(stream if stream is not None else self.torch.cuda.default_stream())

    def sync(self, stream):
        if stream is None:
            self.torch.cuda.synchronize()
        else:
            stream.synchronize()

    def empty_cache(self):
        self.torch.cuda.empty_cache()  # reaches xseg through the adapter

    def set_config(self, text):
        if self.xseg is not None:
            self.xseg.set_config(text)
        elif self.mode.startswith("native"):
            self.torch.cuda.memory._set_allocator_settings(text)

    def total_memory(self):
        return self.torch.cuda.mem_get_info(0)[1]

    def set_fraction(self, fraction):
        if self.xseg is not None:
            self.xseg.set_per_process_memory_fraction(fraction, 0)
        else:
            self.torch.cuda.set_per_process_memory_fraction(fraction, 0)

    def reset(self):
        """Peaks to the current values, accumulated counts to zero (where the allocator can)."""
        if self.xseg is not None:
            self.xseg.reset_peak_memory_stats(0)
            self.xseg.reset_accumulated_memory_stats(0)
            return
        for fn in (self.torch.cuda.reset_peak_memory_stats, self.torch.cuda.reset_accumulated_memory_stats):
            try:
                fn(0)
            except RuntimeError:  # cudaMallocAsync's backend resets fewer statistics
                pass

    def stats(self):
        keys = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "allocated_bytes.all.current",
                "reserved_bytes.all.current"]
        counts = ["num_sync_all_streams", "num_device_alloc", "num_device_free"]
        if self.xseg is not None:
            s = self.xseg.memory_stats(0)
            out = {k: s[k] for k in keys}
            out.update({k: s.get(k) for k in counts})
            return out
        s = self.torch.cuda.memory_stats()
        out = {k: s.get(k, 0) for k in keys}
        out.update({k: s.get(k) for k in counts})
        if not out["reserved_bytes.all.peak"]:
            out["reserved_bytes.all.peak"] = self.torch.cuda.max_memory_reserved()
        if not out["allocated_bytes.all.peak"]:
            out["allocated_bytes.all.peak"] = self.torch.cuda.max_memory_allocated()
        return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def replay(actions, backend, stop_on_fail=False, quiet=False):
    """Run the actions; returns the summary dict (peaks, utilization, host ns per alloc, marks,
    synchronizations). stop_on_fail: stop at the first failed allocation (the fraction search).
    Every tensor is dropped before it returns."""
    streams = {}
    tensors = {}
    alloc_ns = 0
    allocs = failed = 0
    marks = []
    for line, verb, args in actions:
        if verb == "stream":
            streams[args[0]] = backend.new_stream()
        elif verb == "alloc":
            name, size, sname = args
            stream = streams[sname] if sname and sname != "default" else None
            t0 = time.perf_counter_ns()
            try:
                tensors[name] = backend.empty(size, stream)
            except RuntimeError as e:  # torch's OutOfMemoryError is a RuntimeError
                failed += 1
                if not quiet:
                    print("line %d: alloc %s failed: %s" % (line, name, str(e).splitlines()[0]), file=sys.stderr)
                if stop_on_fail:
                    break
            alloc_ns += time.perf_counter_ns() - t0
            allocs += 1
        elif verb == "free":
            t = tensors.pop(args[0], None)
            if t is not None:
                backend.drop(t)
            del t
        elif verb == "record":
            if args[0] in tensors:
                backend.record(tensors[args[0]], streams.get(args[1]))
        elif verb == "sync":
            backend.sync(streams.get(args[0]) if args[0] else None)
        elif verb == "empty_cache":
            backend.empty_cache()
        elif verb == "config":
            backend.set_config(args[0])
        elif verb == "mark":
            s = backend.stats()
            marks.append({"mark": args[0], "allocated": s["allocated_bytes.all.current"],
                          "reserved": s["reserved_bytes.all.current"]})
        # hold / release: emulator-only, nothing to do on a GPU
    s = backend.stats()
    for name in list(tensors):
        backend.drop(tensors.pop(name))
    pa, pr = s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"]
    return {"peak_allocated_bytes": pa, "peak_reserved_bytes": pr,
            "utilization": pa / pr if pr else 0.0, "allocs": allocs, "failed_allocs": failed,
            "host_ns_per_alloc": alloc_ns / allocs if allocs else 0.0, "marks": marks,
            "num_sync_all_streams": s.get("num_sync_all_streams"),
            "num_device_alloc": s.get("num_device_alloc"), "num_device_free": s.get("num_device_free")}


def min_fraction(actions, backend, res, steps, deadline):
    """The smallest memory fraction found at which the trace runs with no failed allocation:
    bisection between peak allocated (below it nothing can run) and the uncapped peak reserved.
    Returns (fraction or None, how many replays, why it stopped early or "")."""
    if res["failed_allocs"]:
        return None, 0, "the uncapped replay failed allocations"
    total = float(backend.total_memory())
    lo = res["peak_allocated_bytes"] / total * (1 - 1e-6)
    hi = min(1.0, res["peak_reserved_bytes"] / total * (1 + 1e-6))
    tries = 0
    why = ""

    def runs(fraction):
        backend.empty_cache()
        backend.set_fraction(fraction)
        ok = replay(actions, backend, stop_on_fail=True, quiet=True)["failed_allocs"] == 0
        backend.set_fraction(1.0)
        backend.empty_cache()
        return ok

    if not runs(hi):  # a cap at the uncapped peak may still fail (the allocator's own margins)
        tries += 1
        hi = 1.0
    else:
        tries += 1
    for _ in range(steps):
        if deadline and time.time() > deadline:
            why = "stopped by --budget after %d replays" % tries
            break
        mid = (lo + hi) / 2
        tries += 1
        if runs(mid):
            hi = mid
        else:
            lo = mid
    return hi, tries, why


def child(args):
    """One allocator (args.child), every trace in turn: one JSON line each."""
    backend = FakeBackend() if args.backend == "fake" else TorchBackend(args.child, args.lib)
    deadline = time.time() + args.budget if args.budget else 0
    for i, path in enumerate(args.traces):
        actions = parse_trace(path)
        backend.empty_cache()
        backend.reset()
        res = replay(actions, backend)
        res["mode"] = args.child
        res["trace"] = path
        res["order"] = i
        if args.min_fraction:
            # this trace's share of what is left of the budget
            share = (deadline - time.time()) / (len(args.traces) - i) if deadline else 0
            try:
                f, tries, why = min_fraction(actions, backend, res, args.fraction_steps,
                                             time.time() + max(share, 0) if deadline else 0)
            except Exception as e:  # e.g. an allocator that refuses a memory fraction: the row stays
                f, tries = None, 0
                why = "search failed: %s" % (str(e).splitlines()[0] if str(e) else type(e).__name__)
                try:
                    backend.set_fraction(1.0)
                except Exception:
                    pass
            res.update({"min_fraction": f, "min_fraction_bytes": int(f * backend.total_memory()) if f else None,
                        "fraction_replays": tries, "fraction_note": why,
                        "device_total_bytes": backend.total_memory()})
        backend.empty_cache()
        print(json.dumps(res), flush=True)
    return 0


def mode_env(mode):
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "XSEG_ALLOC_CONF"):
        env.pop(k, None)
    env.pop("XSEG_LIBCUDA", None)  # PyTorch and xseg must share the real driver
    if mode == "native":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    elif mode == "native-exp":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif mode == "async":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    # xseg, xseg-classic: the config goes to xseg.torch.enable (XSEG_CONFIG)
    return env


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("traces", nargs="+", help="trace files (tools/snapshot2trace.py makes them from snapshots)")
    ap.add_argument("--lib", default="build/libxseg.so", help="path to libxseg.so (default build/libxseg.so)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of: " + ", ".join(MODES))
    ap.add_argument("--backend", choices=["torch", "fake"], default="torch",
                    help="fake: count bytes in-process, no GPU or torch (tests the replay logic)")
    ap.add_argument("--json", action="store_true", help="one JSON object per (trace, mode) instead of the table")
    ap.add_argument("--min-fraction", action="store_true",
                    help="also bisect the smallest set_per_process_memory_fraction that runs each trace")
    ap.add_argument("--fraction-steps", type=int, default=6, help="bisection steps (default 6)")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds for all modes together; the fraction search stops when a mode's share is spent")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error("unknown mode '%s' (known: %s)" % (m, ", ".join(MODES)))
    if args.backend == "torch" and any(m.startswith("xseg") for m in modes) and not os.path.exists(args.lib):
        ap.error("--lib %s: no such file (build xseg first, or leave the xseg modes out)" % args.lib)
    for t in args.traces:  # fail early on a bad trace, before any GPU work
        try:
            parse_trace(t)
        except (OSError, TraceError) as e:
            print("compare_pytorch: %s" % e, file=sys.stderr)
            return 1
    rc = 0
    rows = []
    start = time.time()
    for k, m in enumerate(modes):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", m, "--lib", args.lib,
               "--backend", args.backend, "--fraction-steps", str(args.fraction_steps)]
        if args.min_fraction:
            cmd.append("--min-fraction")
        limit = None
        if args.budget:  # this mode's share of what is left; the uncapped replays get 2 more minutes
            share = max(1.0, (args.budget - (time.time() - start)) / (len(modes) - k))
            cmd += ["--budget", str(share)]
            limit = share + 120
        try:
            p = subprocess.run(cmd + args.traces, env=mode_env(m), capture_output=True, text=True, timeout=limit)
            out, err, code = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:  # keep the traces it finished
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
                "compare_pytorch: %s stopped after %.0f s\n" % (m, limit)
            code = "timeout"
        sys.stderr.write(err)
        got = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        rows += got
        if args.json:  # as each allocator finishes: a caller stopped later keeps these
            for r in got:
                print(json.dumps(r), flush=True)
        if code != 0 or len(got) != len(args.traces):
            done = {r["trace"] for r in got}
            print("compare_pytorch: under %s, %s failed (exit %s)" % (
                m, ", ".join(t for t in args.traces if t not in done) or "the process", code), file=sys.stderr)
            rc = 1
    rows.sort(key=lambda r: (r["order"], modes.index(r["mode"])))
    if not args.json:
        G = float(1 << 30)
        print("%-40s %-13s %12s %12s %8s %10s %7s %6s %9s" % ("trace", "allocator", "peak alloc", "peak resv",
                                                             "util", "ns/alloc", "failed", "syncs", "min frac"))
        for r in rows:
            frac = r.get("min_fraction")
            print("%-40s %-13s %9.3f GiB %9.3f GiB %8.4f %10.0f %7d %6s %9s" % (
                os.path.basename(r["trace"])[:40], r["mode"], r["peak_allocated_bytes"] / G,
                r["peak_reserved_bytes"] / G, r["utilization"], r["host_ns_per_alloc"], r["failed_allocs"],
                "-" if r.get("num_sync_all_streams") is None else r["num_sync_all_streams"],
                "%.4f" % frac if frac else "-"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
