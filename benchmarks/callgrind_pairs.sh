#!/usr/bin/env bash
# Instructions per cached malloc+free pair, repeatable on a noisy machine: run bench_host_path
# under callgrind at two pair counts and divide the difference of the total instruction counts
# by the difference of the counts (start-up, driver loading and warm-up cancel out).
#   benchmarks/callgrind_pairs.sh [BUILD_DIR]      (default build)
# Needs valgrind. Prints one table: allocator (torch: xseg through xseg_torch_malloc/free), mode,
# size, instructions per pair.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_host_path"
[ -x "$bench" ] || { echo "callgrind_pairs.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "callgrind_pairs.sh: valgrind is not installed" >&2; exit 1; }
n1=20000; n2=120000
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

count() { # args...: total instructions (Ir) of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bench" --reps 1 "$@" >/dev/null 2>"$tmp/log" \
    || { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}

# Without libmimalloc.so.2 the benchmark skips mimalloc: say so rather than print a count of 0.
have_mimalloc=1
case $("$bench" --reps 1 --pairs 1 --only mimalloc 2>/dev/null) in *n/a*) have_mimalloc=0 ;; esac

printf "%-12s %-11s %10s %18s\n" allocator mode size "instructions/pair"
for size in 512 4194304; do
  for run in "xseg classic" "xseg expandable" "torch classic" "torch expandable" "glibc -" "mimalloc -"; do
    read -r who mode <<<"$run"
    if [ "$who" = mimalloc ] && [ $have_mimalloc = 0 ]; then
      printf "%-12s %-11s %10s %18s\n" "$who" "$mode" "$size" "n/a (no libmimalloc.so.2)"
      continue
    fi
    # "torch": xseg through PyTorch's entry points (xseg_torch_malloc/free)
    if [ "$who" = torch ]; then args=(--only xseg --api torch --size "$size"); else args=(--only "$who" --size "$size"); fi
    [ "$mode" != - ] && args+=(--mode "$mode")
    a=$(count --pairs $n1 "${args[@]}")
    b=$(count --pairs $n2 "${args[@]}")
    printf "%-12s %-11s %10s %18.1f\n" "$who" "$mode" "$size" "$(echo "($b - $a) / ($n2 - $n1)" | bc -l)"
  done
done
