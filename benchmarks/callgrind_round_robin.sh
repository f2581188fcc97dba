#!/usr/bin/env bash
# Instructions per free+malloc of bench_round_robin (a three-block round robin on the device path,
# which no stream slot serves), repeatable on a noisy machine: callgrind at two step counts, the
# difference of the totals divided by the difference of the counts. Two rows a mode: the small
# pool (512 B, 1 KiB, 1.5 KiB) and the large pool (2, 4, 6 MiB).
#   benchmarks/callgrind_round_robin.sh [BUILD_DIR [BASE_BUILD_DIR]]      (default build)
# With BASE_BUILD_DIR, a column for it and the difference: e.g. the same tree with the placement's
# lifetime rules compiled out (core/device/placement.h), issue 52's cost figure:
#   meson setup build-off -Dc_args=-DXSEG_PLACEMENT_OFF -Dtests=disabled && ninja -C build-off
#   benchmarks/callgrind_round_robin.sh build build-off
# RR_ROWS='MODE:SIZE ...' measures only those rows (e.g. expandable:2097152); CUDAEMU_TOTAL_MEM=8G
# the same on an 8 GiB emulated device (rule S1's regime, under 10 GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
base=${2:-}
for b in "$build" $base; do
  [ -x "$b/benchmarks/bench_round_robin" ] || { echo "callgrind_round_robin.sh: $b/benchmarks/bench_round_robin not built (ninja -C $b)" >&2; exit 1; }
done
command -v valgrind >/dev/null || { echo "callgrind_round_robin.sh: valgrind is not installed" >&2; exit 1; }
n1=20000; n2=120000
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

count() { # build mode size pairs: total instructions (Ir) of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$1/benchmarks/bench_round_robin" --mode "$2" \
    --size "$3" --pairs "$4" >/dev/null 2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}
pair() { # build mode size: instructions per pair
  local a b
  a=$(count "$1" "$2" "$3" $n1)
  b=$(count "$1" "$2" "$3" $n2)
  echo "($b - $a) / ($n2 - $n1)" | bc -l
}

if [ -z "$base" ]; then
  printf "%-11s %-6s %18s\n" mode pool "instructions/pair"
else
  printf "%-11s %-6s %18s %18s %10s\n" mode pool "instructions/pair" "$(basename "$base")" difference
fi
rows=${RR_ROWS:-"classic:512 classic:2097152 expandable:512 expandable:2097152"}
for row in $rows; do
  mode=${row%%:*} size=${row#*:}
  pool=small; [ "$size" -gt 1048576 ] && pool=large
  x=$(pair "$build" "$mode" "$size")
  if [ -z "$base" ]; then
    printf "%-11s %-6s %18.1f\n" "$mode" "$pool" "$x"
  else
    y=$(pair "$base" "$mode" "$size")
    printf "%-11s %-6s %18.1f %18.1f %+9.1f%%\n" "$mode" "$pool" "$x" "$y" "$(echo "($x - $y) * 100 / $y" | bc -l)"
  fi
done
