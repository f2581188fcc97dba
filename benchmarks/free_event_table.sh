#!/usr/bin/env bash
# The driver calls a free makes while release_threshold_mb or idle_release_ms is set (issue 75,
# docs/benchmarks-host.md#free-event): bench_free_event's 100,000 rounds of free then malloc on one
# program stream, by config, on the cudaemu built in BUILD_DIR (its counts).
#   benchmarks/free_event_table.sh [BUILD_DIR]      (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_free_event"
[ -x "$bench" ] || { echo "free_event_table.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
export XSEG_LIBCUDA="$PWD/$build/cudaemu/libcudaemu.so"
n=100000
echo "| config (with \`expandable_segments:True\`) | driver calls per free | calls in all, by entry |"
echo "|---|---:|---|"
for c in idle_release_ms:1000 release_threshold_mb:4096 idle_release_ms:1000,idle_release_thread:True idle_release_ms:5; do
  out=$("$bench" "expandable_segments:True,$c" "$n")
  per=$(echo "$out" | sed -n 's/.*per free \([0-9.]*\),.*/\1/p')
  calls=$(echo "$out" | awk '$2 != "" && $2+0 > 0 && $1 ~ /^cu/ { printf "%s%s %s", sep, $1, $2; sep = ", " }')
  printf "| \`%s\` | %s | %s |\n" "$c" "$per" "${calls:-none}"
done
