#!/usr/bin/env bash
# The choice of what to spill as the declared blocks grow (docs/benchmarks-host.md#walks), in
# instructions (callgrind at two step counts, the difference of the totals divided by the
# difference of the counts, as walk_table.sh): a step of bench_spill_walk (a malloc only spill
# serves, moving pages of one declared 24 MiB block to host memory, its free, xseg_empty_cache
# bringing them back) among D = 0 to 10^5 other declared blocks that cannot move (512 B each),
# and its growth over D = 0: the cost of choosing under the device lock.
#   benchmarks/spill_walk_table.sh [BUILD_DIR]      (default build; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_spill_walk"
[ -x "$bench" ] || { echo "spill_walk_table.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "spill_walk_table.sh: valgrind is not installed" >&2; exit 1; }
n1=5; n2=25
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
count() { # declared steps: total instructions (Ir) of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bench" --declared "$1" --steps "$2" >/dev/null 2>"$tmp/log" ||
    { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}
echo "| declared blocks | instructions per spilling step | over 0 declared blocks |"
echo "|---:|---:|---:|"
base=
for n in 0 1000 10000 100000; do
  a=$(count "$n" $n1)
  b=$(count "$n" $n2)
  v=$(echo "($b - $a) / ($n2 - $n1)" | bc -l)
  [ -z "$base" ] && base=$v
  printf "| %s | %s | %s |\n" "$(printf "%'d" "$n")" "$(printf "%'.0f" "$v")" \
    "$(if [ "$n" = 0 ]; then echo —; else printf "%+'.0f" "$(echo "$v - $base" | bc -l)"; fi)"
done
