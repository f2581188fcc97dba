#!/usr/bin/env bash
# The maintenance calls against the size of the cache (issue 77 item 3,
# docs/benchmarks-host.md#maintenance), in instructions: callgrind with --toggle-collect on the call
# at two call counts, the difference of the totals over the difference of the counts (the heap's
# building and the first call, which releases what it can, cancel out). bench_maintenance's heap:
# F holes of 512 B between live blocks, none holding a whole page.
#   benchmarks/maintenance_table.sh [BUILD_DIR]      (default build; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_maintenance"
[ -x "$bench" ] || { echo "maintenance_table.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "maintenance_table.sh: valgrind is not installed" >&2; exit 1; }
export XSEG_LIBCUDA="$PWD/$build/cudaemu/libcudaemu.so"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
count() { # op mode free calls fn...: instructions collected inside the named functions
  local op=$1 mode=$2 f=$3 c=$4; shift 4
  local tc=()
  for fn in "$@"; do tc+=(--toggle-collect="$fn"); done
  valgrind --tool=callgrind --collect-atstart=no "${tc[@]}" --callgrind-out-file="$tmp/out" \
    "$bench" "$op" "$mode" "$f" "$c" >/dev/null 2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}
commas() { echo "$1" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta'; }
per_call() { # op mode free c1 c2 fn...
  local op=$1 mode=$2 f=$3 c1=$4 c2=$5; shift 5
  local a b
  a=$(count "$op" "$mode" "$f" "$c1" "$@")
  b=$(count "$op" "$mode" "$f" "$c2" "$@")
  commas "$(printf "%.0f" "$(echo "($b - $a) / ($c2 - $c1)" | bc -l)")"
}
echo "| call | mode | free blocks (512 B holes) | instructions per call |"
echo "|---|---|---:|---:|"
for mode in classic expandable; do
  printf "| \`xseg_empty_cache\` | %s | %s | %s |\n" "$mode" "100,000" "$(per_call empty "$mode" 100000 2 12 xseg_empty_cache)"
done
for mode in classic expandable; do
  for f in 1000 10000 100000; do
    printf "| \`xseg_cache_info\` | %s | %s | %s |\n" "$mode" "$(commas "$f")" "$(per_call info "$mode" "$f" 10 110 xseg_cache_info)"
  done
done
printf "| classic LIFO \`xseg_malloc\` + \`xseg_free\` of 512 B beside live blocks | classic | 0 | %s |\n" \
  "$(per_call pair classic 0 20000 120000 xseg_malloc xseg_free)"
