#!/usr/bin/env bash
# Instructions per cached malloc+free pair (512 B) under each service policy, repeatable on a
# noisy machine: bench_services --pairs under callgrind at two pair counts, the difference of the
# total instruction counts divided by the difference of the counts (start-up cancels out). With
# idle_release_thread the thread's passes during the run are counted too (a few per second).
#   benchmarks/callgrind_services.sh [BUILD_DIR]      (default build; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_services"
[ -x "$bench" ] || { echo "callgrind_services.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "callgrind_services.sh: valgrind is not installed" >&2; exit 1; }
n1=20000; n2=120000
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
count() { # config pairs: total instructions (Ir) of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bench" --pairs "$1" "$2" >/dev/null 2>"$tmp/log" \
    || { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}
echo "| config | instructions per pair |"
echo "|---|---|"
for cfg in "expandable_segments:True" "release_threshold_mb:256" "idle_release_ms:1000" \
           "idle_release_ms:1000,idle_release_thread:True"; do
  a=$(count "$cfg" $n1); b=$(count "$cfg" $n2)
  printf "| \`%s\` | %.1f |\n" "$cfg" "$(echo "($b - $a) / ($n2 - $n1)" | bc -l)"
done
