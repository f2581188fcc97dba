#!/usr/bin/env python3
"""front_table: how many of a real program's mallocs and frees can skip the device lock.

usage: benchmarks/front_table.py [--build DIR] [--lone NAME=DIR]... [--no-callgrind] [TRACE...]
       benchmarks/front_table.py --bound-only TRACE...   (the offline bounds only: no replay)

TRACE: PyTorch snapshots (or traces in xseg-replay's language); default the three of issue 77
(hanmin_fullstep, cs336_ctx1024_train, memory_ctx256_fullstep_ from ../shared/traces). Each is
converted with tools/snapshot2trace.py and replayed in one thread, default config, 80 GiB.

The columns and tables, one row a trace:
- today: DIR/tools/xseg-replay under callgrind (valgrind): the mallocs and frees that took the
  device lock (calls of malloc_locked and free_locked against xseg_malloc and xseg_free; a hit of
  the stream's slot that malloc_locked tries before the lock counts with them, an upper bound), and the
  allocator's instructions per malloc and per free (xseg_malloc's and xseg_free's inclusive
  cost over their calls; the emulated driver's work on growth included), and growth's part of
  them: grow_try's inclusive cost (new pages reserved, mapped and indexed), which no front cache
  can serve, so a floor under any front's instructions.
- --lone NAME=DIR (a second table, a row for each trace and build): the same replay of a build
  made with -DXSEG_FRONT_LONE (meson setup DIR -Dc_args=-DXSEG_FRONT_LONE), whose lone thread's
  frees that no stream slot keeps fill its front (core/device/fast.h, fast_put) as on a shared
  stream: what today's fronts, as they are, would serve of the trace, what each malloc and free
  would cost, and the fit (xseg-replay --min-device: the smallest device, to 2 MiB, the trace
  replays on with no failed allocation, over peak allocated); with -DXSEG_FRONT_LONE_FIT too,
  the fronts keep the eager placement's fit (core/device/fast.c, lone_settle_fits). The first row
  of each trace is --build's. A measurement, not a mode: no shipped build has either.
- bound: an offline replay of the trace's operations, no allocator involved. A malloc can skip
  the device lock only when something this thread owns already holds a block for it: a front
  cache holds blocks freed earlier, of the exact rounded size (a larger block would change the
  placement) on the same stream. The bound gives that front unbounded capacity and perfect
  choice: a malloc is served when any block of its (stream, rounded size) was freed and not
  taken again. A free is served when its block is the front's (every block ever handed out,
  through the lock or not: the bound assumes a device-lock malloc enters its block too). The
  second bound adds batch carving for the small pool: a miss of at most 1 MiB carves 3 more
  blocks of its size into the front (held, never asked for; large requests cannot be carved
  without growing the device beyond one 2 MiB step). The third asks what coarser size classes
  could add: a freed block serves any malloc whose rounded size has the same power of two at or
  above it, whichever of the two is larger (more than any front of such classes serves: one that
  rounds its blocks up to their class hands out up to twice the request).
- keeping the placement: what a front could serve without moving any block from where today's
  eager placement puts it. DIR/tools/xseg-replay --history --snapshot records the replay's
  addresses (PyTorch's snapshot format); a malloc counts when its block has the address, rounded
  size and stream of a block freed earlier that no malloc since has overlapped: only then can the
  block have waited whole in a front and come back where the eager placement puts it. An upper
  bound for a front that moves no block (its waiting blocks also change where the mallocs between
  land: the eager free would have merged them).
Standard library only (valgrind and callgrind_annotate for the "today" columns and --lone).
"""
import argparse
import bisect
import glob
import os
import pickle
import re
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "traces"))
DEFAULT = ["public3/hanmin_fullstep.pickle", "public/cs336_ctx1024_train.pickle",
           "pytorch/memory_ctx256_fullstep_.pickle"]
SMALL = 1 << 20


def rounded(n):
    """xseg's and PyTorch's round_size without roundup_power2_divisions."""
    return 512 if n < 512 else (n + 511) // 512 * 512


def as_trace(path, tmp):
    """The trace text of @path (a snapshot is converted)."""
    with open(path, "rb") as f:
        first = f.read(1)
    if first != b"\x80":
        return path
    out = os.path.join(tmp, os.path.basename(path) + ".trace")
    with open(out, "w") as f:
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "snapshot2trace.py"), path], stdout=f,
                       check=True)
    return out


def operations(trace):
    """(kind, buffer, rounded size, stream) of each alloc and free, in order."""
    ops, where = [], {}
    for line in open(trace):
        p = line.split()
        if not p:
            continue
        if p[0] == "alloc":
            stream = next((t[1:] for t in p[3:] if t.startswith("@")), "0")
            where[p[1]] = (rounded(int(p[2])), stream)
            ops.append(("alloc", p[1]) + where[p[1]])
        elif p[0] == "free" and p[1] in where:
            ops.append(("free", p[1]) + where.pop(p[1]))
    return ops


def power_class(size):
    """The power of two at or above @size: a size class that hands out up to twice the request."""
    return 1 << (size - 1).bit_length()


def bound(ops, carve, size_class=None):
    """(mallocs served, frees served, mallocs, frees) of the unbounded front; @carve: extra blocks a
    small miss carves; @size_class: a block serves any malloc whose size maps to its size's class
    (default: the rounded size itself)."""
    held, served_m, served_f, nm, nf = {}, 0, 0, 0, 0
    for kind, _, size, stream in ops:
        key = (stream, size_class(size) if size_class else size)
        if kind == "alloc":
            nm += 1
            if held.get(key, 0):
                held[key] -= 1
                served_m += 1
            elif carve and size <= SMALL:
                held[key] = held.get(key, 0) + carve
        else:
            nf += 1
            served_f += 1  # the bound's front knows every block it handed out
            held[key] = held.get(key, 0) + 1
    return served_m, served_f, nm, nf


def replay_env(build):
    """The environment of @build's xseg-replay: its own cudaemu as the driver."""
    return dict(os.environ, XSEG_LIBCUDA=os.path.join(build, "cudaemu", "libcudaemu.so"))


def today(build, trace, tmp):
    """(lock mallocs, mallocs, lock frees, frees, instructions per malloc, per free, growth's share of
    them) of the replay."""
    out = os.path.join(tmp, "cg.out")
    subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
                    os.path.join(build, "tools", "xseg-replay"), "--summary=none", "--marks=none",
                    "--device-mem", "80G", trace], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, env=replay_env(build))
    names, calls, cfn = {}, {}, None
    for line in open(out):
        m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
        if m:
            if m[3]:
                names[m[2]] = m[3].strip()
            if m[1] == "cfn":
                cfn = names[m[2]]
            continue
        m = re.match(r"calls=(\d+)", line)
        if m:
            calls[cfn] = calls.get(cfn, 0) + int(m[1])
    ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                         capture_output=True, text=True, check=True).stdout
    incl = {}
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+\S*:(xseg_malloc|xseg_free|grow_try)(?: \[|$)", line)
        if m:
            incl[m[2]] = max(incl.get(m[2], 0), int(m[1].replace(",", "")))
    nm, nf = calls.get("xseg_malloc", 0), calls.get("xseg_free", 0)
    return (calls.get("malloc_locked", 0), nm, calls.get("free_locked", 0), nf,
            incl.get("xseg_malloc", 0) / max(nm, 1), incl.get("xseg_free", 0) / max(nf, 1),
            incl.get("grow_try", 0) / max(incl.get("xseg_malloc", 0) + incl.get("xseg_free", 0), 1))


def kept(build, trace, tmp):
    """Mallocs of the replay of @trace by @build that get the address, rounded size and stream of a
    block freed earlier and overlapped by no malloc since (the docstring's "keeping the placement")."""
    snap = os.path.join(tmp, "kept.pickle")
    for old in glob.glob(os.path.join(tmp, "kept*.pickle")):
        os.remove(old)
    r = subprocess.run([os.path.join(build, "tools", "xseg-replay"), "--summary=none", "--marks=none",
                        "--device-mem", "80G", "--history", "--snapshot", snap, trace],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=replay_env(build))
    if r.returncode:
        raise SystemExit("front_table: xseg-replay --snapshot of %s failed:\n%s" % (trace, r.stderr))
    with open(snap, "rb") as f:
        events = pickle.load(f)["device_traces"]
    if len(events) != 1:
        raise SystemExit("front_table: %s replays on %d devices; want one" % (trace, len(events)))
    # Freed blocks no malloc has overlapped since, by address: disjoint (two of them overlapping
    # were live at once, or the later one's malloc overlapped the earlier one's block).
    starts, waiting, served = [], {}, 0
    for e in events[0]:
        if e["action"] == "free_completed":
            bisect.insort(starts, e["addr"])
            waiting[e["addr"]] = (rounded(e["size"]), e["stream"])
        elif e["action"] == "alloc":
            addr, size = e["addr"], rounded(e["size"])
            served += waiting.get(addr) == (size, e["stream"])
            i = bisect.bisect_right(starts, addr) - 1
            if i < 0 or starts[i] + waiting[starts[i]][0] <= addr:
                i += 1
            j = i
            while j < len(starts) and starts[j] < addr + size:
                del waiting[starts[j]]
                j += 1
            del starts[i:j]
    return served


def min_device(build, trace):
    """xseg-replay --min-device's smallest device over peak allocated (its ratio column)."""
    out = subprocess.run([os.path.join(build, "tools", "xseg-replay"), "--min-device", trace],
                         capture_output=True, text=True, check=True, env=replay_env(build)).stdout
    for line in out.splitlines():
        p = line.split()
        if len(p) >= 8 and p[0] == trace:
            return "%s GiB (%s)" % (p[4], p[6])
    raise SystemExit("front_table: no --min-device row for %s" % trace)


def pct(a, b):
    return "%.1f %%" % (100.0 * a / b) if b else "-"


def bounds_only(traces):
    """The offline bounds of each trace (a snapshot's device 0, as tools/snapshot2trace.py converts it)."""
    print("| trace | mallocs | bound: mallocs a front can serve | power-of-two classes |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for path in traces:
            ops = operations(as_trace(path, tmp))
            m, _, nm, _ = bound(ops, 0)
            pm, _, _, _ = bound(ops, 0, power_class)
            full = os.path.abspath(path)
            name = os.path.relpath(full, SHARED) if full.startswith(SHARED + os.sep) else os.path.basename(path)
            print("| %s | %s | %s | %s |" % (name.rsplit(".", 1)[0], "{:,}".format(nm), pct(m, nm), pct(pm, nm)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--lone", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--bound-only", action="store_true")
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()
    for path in a.traces:
        if not os.path.isfile(path):
            raise SystemExit("front_table: %s: no such trace file" % path)
    if a.bound_only:
        if a.lone:
            raise SystemExit("front_table: --lone replays; --bound-only does not")
        return bounds_only(a.traces or [os.path.join(SHARED, t) for t in DEFAULT])
    if not os.access(os.path.join(a.build, "tools", "xseg-replay"), os.X_OK):
        raise SystemExit("front_table: --build %s: no tools/xseg-replay there (a build folder: ninja -C it)"
                         % a.build)
    if a.lone and a.no_callgrind:
        raise SystemExit("front_table: --lone replays under callgrind")
    for spec in a.lone:
        name, eq, build = spec.partition("=")
        if not eq or not name or not os.access(os.path.join(build, "tools", "xseg-replay"), os.X_OK):
            raise SystemExit("front_table: --lone '%s': want NAME=DIR, DIR a build folder with tools/xseg-replay"
                             % spec)
    traces = a.traces or [os.path.join(SHARED, t) for t in DEFAULT]
    cols = ["trace", "mallocs", "frees"]
    if not a.no_callgrind:
        cols += ["today: mallocs / frees through the device lock", "today: instructions a malloc / a free",
                 "today: growth's share of them"]
    cols += ["bound: mallocs / frees a front can serve", "both together",
             "bound with small misses carving 3 more: mallocs / both", "bound, power-of-two classes: mallocs",
             "keeping the placement: mallocs"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    lone = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in traces:
            trace = as_trace(path, tmp)
            ops = operations(trace)
            m, f, nm, nf = bound(ops, 0)
            cm, cf, _, _ = bound(ops, 3)
            pm, _, _, _ = bound(ops, 0, power_class)
            row = [os.path.basename(path).rsplit(".", 1)[0], "{:,}".format(nm), "{:,}".format(nf)]
            if not a.no_callgrind:
                lm, tm, lf, tf, im, if_, grow = today(a.build, trace, tmp)
                row += ["%s / %s" % (pct(lm, tm), pct(lf, tf)), "{:,.0f} / {:,.0f}".format(im, if_),
                        pct(grow, 1)]
                if a.lone:
                    lone.append((row[0], "today (%s)" % a.build, lm, tm, lf, tf, im, if_, a.build, trace))
                    for spec in a.lone:
                        name, _, build = spec.partition("=")
                        lm, tm, lf, tf, im, if_, _ = today(build, trace, tmp)
                        lone.append((row[0], "%s (%s)" % (name, build), lm, tm, lf, tf, im, if_, build, trace))
            row += ["%s / %s" % (pct(m, nm), pct(f, nf)), pct(m + f, nm + nf),
                    "%s / %s" % (pct(cm, nm), pct(cm + cf, nm + nf)), pct(pm, nm), pct(kept(a.build, trace, tmp), nm)]
            print("| " + " | ".join(row) + " |")
        if lone:
            print()
            print("| trace | build | mallocs / frees through the device lock | instructions a malloc / a free |"
                  " smallest device (/ peak) |")
            print("|---|---|---|---|---|")
            for name, what, lm, tm, lf, tf, im, if_, build, trace in lone:
                print("| %s | %s | %s / %s | %s | %s |" % (name, what, pct(lm, tm), pct(lf, tf),
                                                         "{:,.0f} / {:,.0f}".format(im, if_),
                                                         min_device(build, trace)))


if __name__ == "__main__":
    main()
