#!/usr/bin/env bash
# What debug_stale_access costs (issue 50): a recorded training trace replayed on cudaemu with the
# mode off and on, in both segment kinds; one table (markdown) on stdout:
#   - driver memory calls and their modelled H100 time (docs/benchmarks.md's medians, as
#     fit_table.sh), the synchronizations (of streams and of the context);
#   - the mode's own work, as cudaemu counted it (CUDAEMU_REPORT: calls and bytes): the memsets of
#     quarantined blocks at their free, the launches of the allocator's range kernels (vmm/kernel.c:
#     one fills or checks up to 128 blocks), and the copies of the checks (read-backs of blocks, or
#     of the kernel checks' result words; host-to-device copies counted too, none today); modelled at
#     2 TB/s + 5 us a memset, 2 TB/s + 5 us a launch (the bytes its ranges hold: a memset's cost,
#     not measured on a GPU) and 25 GB/s + 10 us a copy either way (cudaemu's h100 preset rate for
#     host copies); in expandable segments whole chunks are swapped for a canary page (one page
#     filled and read back), which the rows with 2 MiB chunks (expandable_chunk_mb:2) show at this
#     scale;
#   - the peak reserved bytes, and what the mode adds against the quarantine's bound.
#   benchmarks/stale_cost.sh [BUILD_DIR] [TRACE_OR_PICKLE]
# Default trace: /work/shared/traces/pytorch/memory_ctx128_fullstep.pickle (a full training step
# of a transformer, recorded by PyTorch) when present, else builtin:training. Sizes are divided
# by STALE_SCALE (default 64) and the quarantine bound with them (debug_quarantine_mb:
# 1024 / STALE_SCALE), because cudaemu backs device memory with host memory and the mode writes
# every freed byte. STALE_SCALE=1 replays the trace as recorded (needs its peak in host RAM).
# STALE_ON_KEYS: more config keys for the "on" rows (e.g. debug_stale_fill_batch:256).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
if [ $# -gt 0 ] && [ -x "$1/tools/xseg-replay" ]; then build=$1; shift; fi
replay="$build/tools/xseg-replay"
[ -x "$replay" ] || { echo "stale_cost.sh: $replay not built (ninja -C $build)" >&2; exit 1; }
emu="$build/cudaemu/libcudaemu.so"
[ -e "$emu" ] || { echo "stale_cost.sh: $emu not built" >&2; exit 1; }
src=${1:-/work/shared/traces/pytorch/memory_ctx128_fullstep.pickle}
[ -e "$src" ] || src=builtin:training
scale=${STALE_SCALE:-64}
qmb=$(( 1024 / scale )); [ "$qmb" -ge 1 ] || qmb=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

case $src in
  builtin:*) XSEG_LIBCUDA=$emu "$replay" --dump "$src" > "$tmp/raw.trace" ;;
  *.pickle) mkdir "$tmp/conv"
            /usr/bin/python3 tools/snapshot2trace.py --out-dir "$tmp/conv" "$src" > "$tmp/list"
            cp "$(head -n 1 "$tmp/list" | cut -f 2)" "$tmp/raw.trace" ;;
  *) cp "$src" "$tmp/raw.trace" ;;
esac
# Divide every size by the scale (at least 1 byte); write the freed bytes for the bound.
/usr/bin/python3 - "$tmp/raw.trace" "$tmp/scaled.trace" "$scale" > "$tmp/freed" <<'PY'
import re, sys
src, dst, scale = sys.argv[1], sys.argv[2], int(sys.argv[3])
units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
size_of, freed, frees = {}, 0, 0
def parse(tok):
    m = re.fullmatch(r"(\d+)(B|KiB|MiB|GiB|TiB)?", tok)
    return int(m.group(1)) * units[m.group(2) or "B"] if m else None
with open(src) as f, open(dst, "w") as out:
    for line in f:
        w = line.split()
        if len(w) >= 3 and w[0] == "alloc":
            n = parse(w[2])
            if n is not None:
                n = max(1, n // scale)
                size_of[w[1]] = n
                w[2] = str(n)
                line = " ".join(w) + "\n"
        elif len(w) >= 2 and w[0] == "free" and w[1] in size_of:
            freed += (size_of[w[1]] + 511) // 512 * 512
            frees += 1
        out.write(line)
print(freed, frees)
PY
read -r freed frees < "$tmp/freed"

run() { # config -> one JSON summary line, and the emulator's call counts in $tmp/report
  XSEG_LIBCUDA=$emu CUDAEMU_REPORT=1 "$replay" --summary=json --marks=none --config "$1" "$tmp/scaled.trace" \
    2> "$tmp/report" | tail -n 1
}
for kind in expandable expandable-2MiB-chunks classic; do
  case $kind in
    expandable) base=expandable_segments:True ;;
    expandable-2MiB-chunks) base=expandable_segments:True,expandable_chunk_mb:2 ;;
    classic) base=expandable_segments:False ;;
  esac
  for mode in off on; do
    cfg=$base
    [ $mode = on ] && cfg="$cfg,debug_stale_access:True,debug_quarantine_mb:$qmb${STALE_ON_KEYS:+,$STALE_ON_KEYS}"
    summary=$(run "$cfg")
    memsets=$(awk '/cudaemu report: cuMemsetD8Async .*call/{print $4}' "$tmp/report"); memsets=${memsets:-0}
    reads=$(awk '/cudaemu report: cuMemcpyDtoHAsync .*call/{print $4}' "$tmp/report"); reads=${reads:-0}
    mbytes=$(awk '/cudaemu report: cuMemsetD8Async .*moved/{print $4}' "$tmp/report"); mbytes=${mbytes:-0}
    rbytes=$(awk '/cudaemu report: cuMemcpyDtoHAsync .*moved/{print $4}' "$tmp/report"); rbytes=${rbytes:-0}
    # Host-to-device copies, should the mode make any (the replay itself makes none).
    ins=$(awk '/cudaemu report: cuMemcpyHtoDAsync .*call/{print $4}' "$tmp/report"); ins=${ins:-0}
    ibytes=$(awk '/cudaemu report: cuMemcpyHtoDAsync .*moved/{print $4}' "$tmp/report"); ibytes=${ibytes:-0}
    launches=$(awk '/cudaemu report: cuLaunchKernel .*call/{print $4}' "$tmp/report"); launches=${launches:-0}
    # Context waits (the mode's checks) are not in the replay's call counts: the report's.
    ctxsyncs=$(awk '/cudaemu report: cuCtxSynchronize .*call/{print $4}' "$tmp/report"); ctxsyncs=${ctxsyncs:-0}
    lbytes=$(awk '/cudaemu report: cuLaunchKernel .*moved/{print $4}' "$tmp/report"); lbytes=${lbytes:-0}
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "$mode" "$summary" "$memsets" "$reads" "$mbytes" \
        "$rbytes" "$((reads + ins))" "$((rbytes + ibytes))" "$launches" "$lbytes" "$ctxsyncs" >> "$tmp/rows"
  done
done

/usr/bin/python3 - "$tmp/rows" "$src" "$scale" "$qmb" "$freed" "$frees" <<'PY'
import json, sys
rows, src, scale, qmb, freed, frees = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
us = {"cuMemCreate": 8.6, "cuMemMap": 0.7, "cuMemSetAccess": 21.9, "cuMemUnmap": 15.5,
      "cuMemRelease": 20.4, "cuMemAlloc": 39.0, "cuMemFree": 42.8}
print(f"Trace: {src}, sizes / {scale}; {frees:,} frees of {freed / 2**20:,.1f} MiB; "
      f"on: debug_quarantine_mb:{qmb}.\n")
print("| segments | mode | driver memory calls | VMM time (ms) | syncs | memsets (MiB) | kernel launches (MiB) | "
      "copies (MiB) | fill + check (ms) | total modelled (ms) | × off | peak reserved (MiB) | added (MiB) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
base = {}
for line in open(rows):
    kind, mode, summary, memsets, _reads, mbytes, _rbytes, reads, rbytes, launches, lbytes, ctxsyncs = \
        line.rstrip("\n").split("\t")
    s = json.loads(summary)
    calls = s["driver_calls"]
    vmm = sum(us.get(k, 0) * v for k, v in calls.items()) / 1000
    memsets, reads, mbytes, rbytes = int(memsets), int(reads), int(mbytes), int(rbytes)
    launches, lbytes = int(launches), int(lbytes)
    # ms: a memset or a launch 5 us + its bytes at 2 TB/s; a copy 10 us + its bytes at 25 GB/s.
    extra = ((mbytes / 2e12 * 1e3 + memsets * 5e-3) + (lbytes / 2e12 * 1e3 + launches * 5e-3) +
             (rbytes / 25e9 * 1e3 + reads * 10e-3))
    total = vmm + extra
    peak = s["peak_reserved_bytes"] / 2**20
    if mode == "off":
        base[kind] = (total, peak)
    t0, p0 = base[kind]
    syncs = calls.get('cuStreamSynchronize', 0) + int(ctxsyncs)
    print(f"| {kind} | {mode} | {s['driver_memory_calls']:,} | {vmm:.1f} | {syncs} | "
          f"{memsets:,} ({mbytes / 2**20:,.0f}) | {launches:,} ({lbytes / 2**20:,.0f}) | "
          f"{reads:,} ({rbytes / 2**20:,.0f}) | {extra:.1f} | {total:.1f} | "
          f"{total / t0 if t0 else float('nan'):.2f} | "
          f"{peak:,.1f} | {peak - p0:+,.1f} |")
PY
