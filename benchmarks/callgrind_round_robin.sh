#!/usr/bin/env bash
# Instructions per free+malloc of bench_round_robin (a three-block round robin on the device path,
# which no stream slot serves), repeatable on a noisy machine: callgrind at two step counts, the
# difference of the totals divided by the difference of the counts.
#   benchmarks/callgrind_round_robin.sh [BUILD_DIR]      (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_round_robin"
[ -x "$bench" ] || { echo "callgrind_round_robin.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "callgrind_round_robin.sh: valgrind is not installed" >&2; exit 1; }
n1=20000; n2=120000
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

count() { # mode pairs: total instructions (Ir) of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bench" --mode "$1" --pairs "$2" >/dev/null 2>"$tmp/log" \
    || { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}

printf "%-11s %18s\n" mode "instructions/pair"
for mode in classic expandable; do
  a=$(count "$mode" $n1)
  b=$(count "$mode" $n2)
  printf "%-11s %18.1f\n" "$mode" "$(echo "($b - $a) / ($n2 - $n1)" | bc -l)"
done
