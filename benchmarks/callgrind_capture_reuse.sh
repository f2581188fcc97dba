#!/usr/bin/env bash
# Instructions per allocation during a capture, for each configuration of bench_capture_reuse
# (graph_capture_record_stream_reuse off; on; on with the side stream joining back only at the
# end), under callgrind: only the captured layers are counted (--toggle-collect=capture_layers),
# so start-up, the capture's begin/end and the clean-up between runs are left out. Independent
# of the machine's load. Columns: all instructions per allocation and their ratio to off, then
# the part spent in the emulated driver's entry points (libcudaemu, inclusive: graph building,
# capture queries; a real driver's cost differs), then the rest (the program's and xseg's own).
# A Markdown table: docs/benchmarks.md's (benchmarks/record.py --write capture-reuse).
#   benchmarks/callgrind_capture_reuse.sh [BUILD_DIR] [NODES...]   (default build, 1000 4000 16000)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
nodes=("$@")
[ ${#nodes[@]} -gt 0 ] || nodes=(1000 4000 16000)
bench="$build/benchmarks/bench_capture_reuse"
[ -x "$bench" ] || { echo "callgrind_capture_reuse.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "callgrind_capture_reuse.sh: valgrind is not installed" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# prints: total instructions, instructions inside libcudaemu's entry points (which never nest)
count() { # NODES CONFIG
  valgrind --tool=callgrind --toggle-collect=capture_layers --callgrind-out-file="$tmp/out" \
    "$bench" --reps 1 --nodes "$1" --config "$2" >/dev/null 2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate --inclusive=yes --threshold=100 "$tmp/out" 2>/dev/null | awk '
    /PROGRAM TOTALS/ && !t { gsub(",", "", $1); t = $1 }
    /:(cu[A-Z][A-Za-z0-9_]*|cudaemu_[a-z_]*) \[.*libcudaemu\.so\]$/ { gsub(",", "", $1); e += $1 }
    END { printf "%d %d\n", t, e }'
}

echo "| nodes | allocations | capture reuse | instructions per allocation | vs off | in cudaemu | the rest |"
echo "|---:|---:|---|---:|---:|---:|---:|"
for n in "${nodes[@]}"; do
  allocs=$(( 2 * (n / 6 + 1) ))   # two allocations per layer of 6 nodes (--work 4)
  off=
  for c in off on unjoined; do
    read -r total emu < <(count "$n" "$c")
    [ -z "$off" ] && off=$total
    printf "| %d | %d | %s | %.0f | %.2f | %.0f | %.0f |\n" "$n" "$allocs" "$c" \
      "$(echo "$total / $allocs" | bc -l)" "$(echo "$total / $off" | bc -l)" \
      "$(echo "$emu / $allocs" | bc -l)" "$(echo "($total - $emu) / $allocs" | bc -l)"
  done
done
