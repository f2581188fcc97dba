#!/usr/bin/env bash
# Instructions per recorded allocation (a cached malloc+free pair, 24 calls deep) for each
# setting of bench_history, under callgrind: two pair counts, the difference divided, so
# start-up and warm-up cancel out (as callgrind_pairs.sh). Independent of the machine's load;
# callgrind counts user-space instructions only (a clock_gettime that enters the kernel, as on
# some VMs, counts as its user-space part).
#   benchmarks/callgrind_history.sh [BUILD_DIR]      (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_history"
[ -x "$bench" ] || { echo "callgrind_history.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "callgrind_history.sh: valgrind is not installed" >&2; exit 1; }
n1=2000; n2=12000
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

count() { # args...: total instructions (Ir) of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bench" "$@" >"$tmp/stdout" 2>"$tmp/log" \
    || { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}

printf "%-30s %22s\n" setting "instructions/alloc"
for k in 0 1 2 3 4 5 6 7; do
  a=$(count --setting $k --pairs $n1)
  name=$(sed 's/: .*//' "$tmp/stdout")
  b=$(count --setting $k --pairs $n2)
  printf "%-30s %22.0f\n" "$name" "$(echo "($b - $a) / ($n2 - $n1)" | bc -l)"
done
