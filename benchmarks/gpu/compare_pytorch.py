#!/usr/bin/env python3
"""Replay xseg-replay traces through PyTorch with real tensors, under each allocator, and print
one table: peak allocated, peak reserved, utilization, host time per allocation.

Allocators (each in its own subprocess: PyTorch fixes its allocator at first CUDA use):
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

usage: compare_pytorch.py --lib build/libxseg.so TRACE... [--modes native,xseg,...]
       compare_pytorch.py --backend fake TRACE      (no GPU, no torch: checks the replay logic)
"""
import argparse
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
    with open(path) as f:
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
    """Counts bytes like an allocator that reserves exactly what is live (no GPU, no torch)."""

    def __init__(self):
        self.live = 0
        self.peak = 0

    def new_stream(self):
        return object()

    def empty(self, size, stream):
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
                "allocated_bytes.all.current": self.live, "reserved_bytes.all.current": self.live}


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

    def stats(self):
        keys = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "allocated_bytes.all.current",
                "reserved_bytes.all.current"]
        if self.xseg is not None:
            s = self.xseg.memory_stats(0)
            return {k: s[k] for k in keys}
        s = self.torch.cuda.memory_stats()
        out = {k: s.get(k, 0) for k in keys}
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


def replay(actions, backend):
    """Run the actions; returns the summary dict (peaks, utilization, host ns per alloc, marks)."""
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
                print("line %d: alloc %s failed: %s" % (line, name, str(e).splitlines()[0]), file=sys.stderr)
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
    pa, pr = s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"]
    return {"peak_allocated_bytes": pa, "peak_reserved_bytes": pr,
            "utilization": pa / pr if pr else 0.0, "allocs": allocs, "failed_allocs": failed,
            "host_ns_per_alloc": alloc_ns / allocs if allocs else 0.0, "marks": marks}


def child(args):
    actions = parse_trace(args.traces[0])
    backend = FakeBackend() if args.backend == "fake" else TorchBackend(args.child, args.lib)
    res = replay(actions, backend)
    res["mode"] = args.child
    res["trace"] = args.traces[0]
    print(json.dumps(res))
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
    for t in args.traces:
        for m in modes:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", m, "--lib", args.lib,
                   "--backend", args.backend, t]
            p = subprocess.run(cmd, env=mode_env(m), capture_output=True, text=True)
            sys.stderr.write(p.stderr)
            if p.returncode != 0 or not p.stdout.strip():
                print("compare_pytorch: %s under %s failed (exit %d)" % (t, m, p.returncode), file=sys.stderr)
                rc = 1
                continue
            res = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(res)
            if args.json:
                print(json.dumps(res))
    if not args.json:
        G = float(1 << 30)
        print("%-40s %-13s %12s %12s %8s %10s %7s" % ("trace", "allocator", "peak alloc", "peak resv",
                                                       "util", "ns/alloc", "failed"))
        for r in rows:
            print("%-40s %-13s %9.3f GiB %9.3f GiB %8.4f %10.0f %7d" % (
                os.path.basename(r["trace"])[:40], r["mode"], r["peak_allocated_bytes"] / G,
                r["peak_reserved_bytes"] / G, r["utilization"], r["host_ns_per_alloc"], r["failed_allocs"]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
