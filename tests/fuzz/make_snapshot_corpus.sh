#!/usr/bin/env bash
# Regenerate tests/fuzz/corpus/snapshot2trace/, the seeds of the snapshot2trace fuzzer:
# snapshots in PyTorch's format written by xseg itself (xseg-replay --history --snapshot: protocol 2) from
# small traces that reach most of the format (two streams, frames, a deferred free, a private
# pool, a capture with a fork, an OOM; both modes), and one of them pickled again in protocol 4,
# as PyTorch's _dump_snapshot writes (frames, memo opcodes, short strings), and in protocol 0
# (the text opcodes); PyTorch 2.0's layout and a file with two devices, made from them. Stream
# handles differ from run to run, so the bytes do too.
#   tests/fuzz/make_snapshot_corpus.sh [BUILD_DIR]     (default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=tests/fuzz/corpus/snapshot2trace
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XSEG_LIBCUDA=$PWD/$build/cudaemu/libcudaemu.so
replay() { "$build/tools/xseg-replay" --no-progress --summary=none --marks=none --history "$@" 2>/dev/null; }
mkdir -p "$out"
rm -f "$out"/*.pickle

cat >"$tmp/streams.trace" <<'T'
stream s
frame k1 12 model.py forward
frame k1 40 train.py step
frame k2 7 data%20loader.py next
alloc w 3MiB ^k1
alloc x 300KiB @s ^k2
alloc y 1000
record w @s
hold @s
free w
free y
release @s
alloc z 25MiB @s ^k1
free x
empty_cache
T
cat >"$tmp/pools.trace" <<'T'
stream s
stream u
alloc a 2MiB
pool_begin p @s
alloc b 1MiB @s
alloc c 700KiB @s
pool_end p
free b
capture_begin @s g
alloc t 4MiB @s
wait @u @s
alloc t2 600 @u
work @u
free t2
wait @s @u
free t
capture_end @s
free c
T
printf 'alloc big 48MiB\nalloc more 40MiB\nfree big\nalloc small 512\n' >"$tmp/oom.trace"

for mode in expandable classic; do
  cfg=expandable_segments:$([ $mode = expandable ] && echo True || echo False)
  replay --config "$cfg" --snapshot "$out/streams_frames_$mode.pickle" "$tmp/streams.trace"
  replay --config "$cfg" --snapshot "$out/pool_capture_$mode.pickle" "$tmp/pools.trace"
done
replay --device-mem 64M --snapshot "$out/oom.pickle" "$tmp/oom.trace"
/usr/bin/python3 - "$out" <<'PY'
import importlib.util, os, pickle, sys
out = sys.argv[1]
spec = importlib.util.spec_from_file_location("s2t", "tools/snapshot2trace.py")
s2t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s2t)
with open(os.path.join(out, "streams_frames_expandable.pickle"), "rb") as f:
    snap = s2t.load_snapshot(f.read())
for proto in (0, 4):
    with open(os.path.join(out, "streams_frames_protocol%d.pickle" % proto), "wb") as f:
        pickle.dump(snap, f, protocol=proto)
# PyTorch 2.0's layout (blocks without address, the request in `history`, no pool ids), and the
# same data on device 1 beside device 0 (every device converts).
with open(os.path.join(out, "pool_capture_classic.pickle"), "rb") as f:
    snap = s2t.load_snapshot(f.read())
old = {"segments": [], "device_traces": snap["device_traces"]}
for s in snap["segments"]:
    s = {k: v for k, v in s.items() if k not in ("segment_pool_id", "is_expandable", "frames")}
    s["blocks"] = [{"size": b["size"], "requested_size": b.get("requested_size", 0), "state": b["state"],
                    "history": [{"addr": b["address"], "real_size": b.get("requested_size", 0),
                                 "frames": b.get("frames", [])}] if b["state"] != "inactive" else []}
                   for b in s["blocks"]]
    old["segments"].append(s)
with open(os.path.join(out, "pt20_layout.pickle"), "wb") as f:
    pickle.dump(old, f, protocol=2)
two = dict(snap, device_traces=snap["device_traces"] * 2,
           segments=snap["segments"] + [dict(s, device=1) for s in snap["segments"]])
with open(os.path.join(out, "two_devices.pickle"), "wb") as f:
    pickle.dump(two, f, protocol=4)
PY
ls -l "$out"
