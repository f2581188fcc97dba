#!/usr/bin/env bash
# Instructions per cached malloc+free pair, repeatable on a noisy machine: run bench_host_path
# under callgrind at two pair counts and divide the difference of the total instruction counts
# by the difference of the counts (start-up, driver loading and warm-up cancel out).
#   benchmarks/callgrind_pairs.sh [--check] [BUILD_DIR...]     (default: build build-release)
# Each build is measured in its own column, named by its meson buildtype: the debugoptimized
# build the tests use and the release build users get (gcc inlines differently at -O3, so a
# frame the one gains the other may not show):
#   meson setup build-release --buildtype=release -Dtests=disabled
#   ninja -C build-release benchmarks/bench_host_path cudaemu/libcudaemu.so
# A build without its folder is left out (with a note on stderr), unless it is the only one.
# Needs valgrind. Prints one table: allocator (torch: xseg through xseg_torch_malloc/free), mode,
# size, instructions per pair in each build; then a line per build with xseg's cached pair
# against its target (TARGETS below); --check exits 2 when one is missed. Without XSEG_LIBCUDA,
# each build runs on its own cudaemu.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
# The cached pair's ceiling per buildtype (xseg's own entry points, both modes, both sizes).
declare -A TARGETS=([debugoptimized]=96 [release]=103)
builds=()
if [ $# -gt 0 ]; then builds=("$@"); else
  builds=(build)
  if [ -d build-release ]; then builds+=(build-release); else echo "callgrind_pairs.sh: no build-release, debugoptimized only" >&2; fi
fi
command -v valgrind >/dev/null || { echo "callgrind_pairs.sh: valgrind is not installed" >&2; exit 1; }
types=()
for b in "${builds[@]}"; do
  [ -x "$b/benchmarks/bench_host_path" ] || { echo "callgrind_pairs.sh: $b/benchmarks/bench_host_path not built (ninja -C $b)" >&2; exit 1; }
  t=$(/usr/bin/python3 -c 'import json, sys
opts = json.load(open(sys.argv[1] + "/meson-info/intro-buildoptions.json"))
print(next(o["value"] for o in opts if o["name"] == "buildtype"))' "$b")
  types+=("$t")
done
n1=20000; n2=120000
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

count() { # build args...: total instructions (Ir) of one run
  local b=$1; shift
  XSEG_LIBCUDA=${XSEG_LIBCUDA:-$PWD/$b/cudaemu/libcudaemu.so} \
    valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$b/benchmarks/bench_host_path" --reps 1 "$@" >/dev/null 2>"$tmp/log" \
    || { cat "$tmp/log" >&2; exit 1; }
  callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}

# Without libmimalloc.so.2 the benchmark skips mimalloc: say so rather than print a count of 0.
have_mimalloc=1
case $("${builds[0]}/benchmarks/bench_host_path" --reps 1 --pairs 1 --only mimalloc 2>/dev/null) in *n/a*) have_mimalloc=0 ;; esac

printf "%-12s %-11s %10s" allocator mode size
for t in "${types[@]}"; do printf " %15s" "$t"; done
printf "\n"
declare -A worst
for size in 512 4194304; do
  for run in "xseg classic" "xseg expandable" "torch classic" "torch expandable" "glibc -" "mimalloc -"; do
    read -r who mode <<<"$run"
    printf "%-12s %-11s %10s" "$who" "$mode" "$size"
    if [ "$who" = mimalloc ] && [ $have_mimalloc = 0 ]; then
      for t in "${types[@]}"; do printf " %15s" n/a; done
      printf "\n"
      continue
    fi
    # "torch": xseg through PyTorch's entry points (xseg_torch_malloc/free)
    if [ "$who" = torch ]; then args=(--only xseg --api torch --size "$size"); else args=(--only "$who" --size "$size"); fi
    [ "$mode" != - ] && args+=(--mode "$mode")
    for i in "${!builds[@]}"; do
      a=$(count "${builds[$i]}" --pairs $n1 "${args[@]}")
      b=$(count "${builds[$i]}" --pairs $n2 "${args[@]}")
      v=$(echo "($b - $a) / ($n2 - $n1)" | bc -l)
      printf " %15.1f" "$v"
      if [ "$who" = xseg ]; then
        w=${worst[$i]:-0}
        worst[$i]=$(echo "if ($v > $w) $v else $w" | bc -l)
      fi
    done
    printf "\n"
  done
done
[ $have_mimalloc = 0 ] && echo "(mimalloc: n/a, no libmimalloc.so.2)"
missed=0
for i in "${!builds[@]}"; do
  t=${types[$i]}; target=${TARGETS[$t]:-}
  w=$(printf "%.1f" "${worst[$i]}")
  if [ -z "$target" ]; then
    echo "xseg cached pair, $t (${builds[$i]}): at most $w (no target for a $t build)"
  elif [ "$(echo "$w <= $target" | bc -l)" = 1 ]; then
    echo "xseg cached pair, $t (${builds[$i]}): at most $w, target ≤ $target: met"
  else
    echo "xseg cached pair, $t (${builds[$i]}): at most $w, target ≤ $target: MISSED"
    missed=1
  fi
done
[ $check = 1 ] && [ $missed = 1 ] && exit 2
exit 0
