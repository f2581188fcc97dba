#!/usr/bin/env bash
# The walks under the device lock at their worst (docs/benchmarks-host.md#walks), in instructions
# (callgrind at two step counts, the difference of the totals divided by the difference of the
# counts, as callgrind_round_robin.sh): a step of bench_walks (40 frees, a malloc predicted
# long-lived that takes the top placement among F free blocks that all fit it, its free, 40
# mallocs) at F = 16 to 8,192, and its growth over F = 16: the walk's cost as the heap grows.
#   benchmarks/walk_table.sh [BUILD_DIR]      (default build; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_walks"
[ -x "$bench" ] || { echo "walk_table.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "walk_table.sh: valgrind is not installed" >&2; exit 1; }
n1=200; n2=1200
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
count() { # free steps: total instructions (Ir) of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bench" --free "$1" --steps "$2" >/dev/null 2>"$tmp/log" ||
    { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}
echo "| fitting free blocks | instructions per step | over 16 free blocks |"
echo "|---:|---:|---:|"
base=
for f in 16 256 1024 4096 8192; do
  a=$(count "$f" $n1)
  b=$(count "$f" $n2)
  v=$(echo "($b - $a) / ($n2 - $n1)" | bc -l)
  [ -z "$base" ] && base=$v
  printf "| %s | %s | %s |\n" "$(printf "%'d" "$f")" "$(printf "%'.0f" "$v")" \
    "$(if [ "$f" = 16 ]; then echo —; else printf "%+'.0f" "$(echo "$v - $base" | bc -l)"; fi)"
done
