#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot into an xseg-replay trace.

    tools/snapshot2trace.py SNAPSHOT.pickle [--device N] > TRACE

SNAPSHOT is what torch.cuda.memory._dump_snapshot() writes (a pickle; loading it needs no torch).
The snapshot's `device_traces` is a window: allocations made before recording began appear only
as frees without an alloc, or as live blocks in `segments`. Those are seeded as allocations at
the start of the trace (in address order), so the replay starts from the live memory the
original program had. `alloc` and `free_completed` events become `alloc` and `free` lines (a
free becomes final only at free_completed: with record_stream the memory is reused only then);
streams other than 0 become declared streams.

The header carries what PyTorch's own allocator did in the window, from the segment events:
peak allocated, peak reserved (counting what was reserved before the window), utilization, as
`# pytorch:` comment lines that tools can read back.

Python standard library only.
"""
import argparse
import pickle
import sys


class _Stub:
    """Stands in for any class the pickle names (a snapshot written by a newer torch may
    reference one); the plain dicts and lists we need are unaffected."""

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.state = state


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module in ("builtins", "collections", "copyreg", "_codecs"):
            return super().find_class(module, name)
        return _Stub


def round_block(size):
    """PyTorch's rounding of a request to a block size (512-byte multiples, at least 512)."""
    return max(512, (size + 511) // 512 * 512)


def convert(snapshot, device, out, source="snapshot"):
    """Write the trace for `device` of the loaded `snapshot` to `out`. Returns a dict of figures."""
    if isinstance(snapshot, list):
        raise ValueError("%s holds only segments (a bare list): record it with "
                         "torch.cuda.memory._record_memory_history() to get device_traces" % source)
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError("%s is not a PyTorch memory snapshot (no 'device_traces' key)" % source)
    traces = snapshot["device_traces"]
    if device < 0 or device >= len(traces):
        raise ValueError("%s has traces for %d device(s); device %d is out of range"
                         % (source, len(traces), device))
    events = traces[device]
    segments = [s for s in snapshot.get("segments", []) if s.get("device", 0) == device]

    streams = {}  # stream id -> name

    def stream_ref(sid):
        if not sid:
            return ""
        if sid not in streams:
            streams[sid] = "s%x" % sid
        return " @" + streams[sid]

    live = {}       # addr -> (name, size, stream)
    seeds = []      # (addr, name, size, stream)
    body = []
    counter = 0
    seg_delta = 0   # reserved bytes added during the window
    for i, e in enumerate(events):
        action = e.get("action")
        addr = e.get("addr", 0)
        size = e.get("size", 0)
        sid = e.get("stream", 0)
        if action == "alloc":
            if addr in live:
                # The window lost this block's free (a ring buffer can): free it here.
                body.append("free %s  # its free_completed is missing from the window" % live[addr][0])
            name = "a%d" % counter
            counter += 1
            live[addr] = (name, size, sid)
            body.append("alloc %s %d%s" % (name, size, stream_ref(sid)))
        elif action == "free_completed":
            if addr in live:
                body.append("free %s" % live.pop(addr)[0])
            else:
                name = "pre%d" % counter
                counter += 1
                seeds.append((addr, name, size, sid, round_block(size)))
                body.append("free %s" % name)
        elif action in ("segment_alloc", "segment_map"):
            seg_delta += size
            body.append(("#seg+ %d" % size))
        elif action in ("segment_free", "segment_unmap"):
            seg_delta -= size
            body.append(("#seg- %d" % size))
        elif action == "oom":
            body.append("# the original run hit an OOM here (device free: %s)" % e.get("device_free", "?"))
        # free_requested, snapshot, user annotations: nothing to replay
    # Blocks alive when the snapshot was written that the window never allocated: live all along.
    for s in segments:
        for b in s.get("blocks", []):
            if b.get("state") in ("active_allocated", "active_pending_free") and b["address"] not in live:
                name = "pre%d" % counter
                counter += 1
                size = b.get("requested_size") or b["size"]
                # The program asked for requested_size; PyTorch counted the whole block.
                seeds.append((b["address"], name, size, s.get("stream", 0), b["size"]))
    seeds.sort()

    # PyTorch's figures: reserved at the window's start is what the segments hold now minus what
    # the window added; allocated at the start is the seeds (rounded as PyTorch rounds blocks).
    reserved = sum(s["total_size"] for s in segments) - seg_delta
    allocated = sum(blk for _, _, _, _, blk in seeds)
    peak_res, peak_alloc = reserved, allocated
    sizes = {}
    for _, name, _, _, blk in seeds:
        sizes[name] = blk
    lines = []
    for line in body:
        if line.startswith("#seg+ "):
            reserved += int(line[6:])
            peak_res = max(peak_res, reserved)
            continue
        if line.startswith("#seg- "):
            reserved -= int(line[6:])
            continue
        if line.startswith("alloc "):
            _, name, sz = line.split()[:3]
            sizes[name] = round_block(int(sz))
            allocated += sizes[name]
            peak_alloc = max(peak_alloc, allocated)
        elif line.startswith("free "):
            allocated -= sizes.pop(line.split()[1])
        lines.append(line)

    figures = {
        "events": len(events),
        "peak_allocated_bytes": peak_alloc,
        "peak_reserved_bytes": peak_res,
        "utilization": peak_alloc / peak_res if peak_res else 0.0,
    }
    settings = snapshot.get("allocator_settings") or {}
    w = out.write
    w("# xseg-replay trace converted from the PyTorch snapshot %s (device %d) by tools/snapshot2trace.py\n"
      % (source, device))
    w("# %d events; %d allocations seeded from before the window\n" % (len(events), len(seeds)))
    if settings:
        w("# recorded with expandable_segments=%s PYTORCH_CUDA_ALLOC_CONF=%r\n"
          % (settings.get("expandable_segments"), settings.get("PYTORCH_CUDA_ALLOC_CONF", "")))
    for k in ("peak_allocated_bytes", "peak_reserved_bytes"):
        w("# pytorch: %s=%d (%.2f GiB)\n" % (k, figures[k], figures[k] / 2**30))
    w("# pytorch: utilization=%.4f\n" % figures["utilization"])
    for sid, name in sorted(streams.items()):
        w("stream %s\n" % name)
    for _, name, sz, sid, _ in seeds:
        w("alloc %s %d%s\n" % (name, sz, stream_ref(sid)))
    w("mark window start (seeded)\n")
    for line in lines:
        w(line + "\n")
    w("mark end of window\n")
    return figures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Writes the trace on standard output.")
    ap.add_argument("snapshot", help="a pickle written by torch.cuda.memory._dump_snapshot")
    ap.add_argument("--device", type=int, default=0, help="which device's trace (default 0)")
    args = ap.parse_args(argv)
    try:
        with open(args.snapshot, "rb") as f:
            snap = _Unpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        print("snapshot2trace: %s: %s" % (args.snapshot, e), file=sys.stderr)
        return 1
    try:
        convert(snap, args.device, sys.stdout, source=args.snapshot.rsplit("/", 1)[-1])
    except ValueError as e:
        print("snapshot2trace: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
