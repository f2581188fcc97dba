#!/usr/bin/env bash
# The spill table of docs/benchmarks-replay.md (issue 49): each trace replayed on an emulated
# device SPILL_FRACTION (default 0.8, "20 % below") of its peak allocated, rounded down to 2 MiB,
# with spill_to_host off and on: failed allocations, and with spill the peak of bytes on host
# memory, pages spilled and promoted, bytes copied and their modelled link time (xseg-replay's
# 25 GB/s, tools/replay/report.h) and spill's waits for the device (context synchronizes: the
# contract's cost, counted by cudaemu). Spill moves only blocks declared cold (docs/services.md): the
# spill-on replay declares each block right after its allocation (xseg-replay --cold; a trace
# records no use between allocation and free, so the promise holds). Peak allocated comes from a replay on 80 GiB with the default
# config. With SPILL_BASELINE=OTHER_BUILD the spill-off replay is compared with that build's
# (everything but host times: "same" when identical, the fit table's figures unchanged).
#   benchmarks/spill_table.sh [BUILD_DIR] [TRACE_OR_PICKLE...]
#   default traces: /work/shared/traces/pytorch/memory_ctx128_fullstep.pickle (third-party data,
#   never copied into the repository). Needs /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
replay="$build/tools/xseg-replay"
[ -x "$replay" ] || { echo "spill_table.sh: $replay not built (ninja -C $build)" >&2; exit 1; }
frac=${SPILL_FRACTION:-0.8}
traces=("$@")
[ ${#traces[@]} -gt 0 ] || traces=(/work/shared/traces/pytorch/memory_ctx128_fullstep.pickle)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# One replay's JSON summary (the last line).
run() { # REPLAY DEVICE_MEM CONFIG TRACE [FLAG...]
  "$1" --summary=json --marks=none --device-mem "$2" --config "$3" "${@:5}" "$4" 2>/dev/null | tail -1
}
field() { /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
strip_times() {
  /usr/bin/python3 -c 'import json,sys; d=json.loads(sys.stdin.read())
for k in list(d):
    if "ns_per" in k or "spill" in k or "promot" in k: d.pop(k)
print(json.dumps(d, sort_keys=True))'
}

echo "| trace | peak allocated (GiB) | device (MiB) | failed, spill off | failed, spill on | spilled at peak (GiB) | pages spilled / promoted | copied (GiB) | link time (ms) | device waits |${SPILL_BASELINE:+ spill off vs baseline |}"
echo "|---|---|---|---|---|---|---|---|---|---|${SPILL_BASELINE:+---|}"
for t in "${traces[@]}"; do
  case $t in
    *.pickle)
      mkdir -p "$tmp/conv"
      /usr/bin/python3 tools/snapshot2trace.py --out-dir "$tmp/conv" "$t" > "$tmp/list"
      spec=$(head -1 "$tmp/list" | cut -f2) ;;
    *) spec=$t ;;
  esac
  name=$(basename "$t"); name=${name%.*}
  peak=$(run "$replay" 80G expandable_segments:True "$spec" | field peak_allocated_bytes)
  mib=$(/usr/bin/python3 -c "import sys; m=int(int(sys.argv[1])*float(sys.argv[2])) >> 20; print(m - m % 2)" "$peak" "$frac")
  off=$(run "$replay" "${mib}MiB" expandable_segments:True "$spec")
  on=$(run "$replay" "${mib}MiB" expandable_segments:True,spill_to_host:True "$spec" --cold)
  base=""
  if [ -n "${SPILL_BASELINE:-}" ]; then
    b=$(run "$SPILL_BASELINE/tools/xseg-replay" "${mib}MiB" expandable_segments:True "$spec")
    if [ "$(echo "$b" | strip_times)" = "$(echo "$off" | strip_times)" ]; then base=" same |"; else base=" differs |"; fi
  fi
  /usr/bin/python3 - "$name" "$peak" "$mib" "$off" "$on" "$base" <<'EOF'
import json, sys
name, peak, mib, off, on, base = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6]
G = float(1 << 30)
print("| %s | %.3f | %s | %d | %d | %.3f | %d / %d | %.3f | %.1f | %d |%s" % (
    name, peak / G, mib, off["failed_allocs"], on["failed_allocs"], on["spilled_peak_bytes"] / G,
    on["num_spills"], on["num_promotions"], on["spill_copied_bytes"] / G, 1e3 * on["spill_link_seconds"],
    on["spill_context_syncs"], base))
EOF
done
