#!/usr/bin/env bash
# The churn pair of bench_scale (free a random live block, allocate a random size) at L live
# blocks, in instructions and cache misses, repeatable where wall time is not: cachegrind runs
# `bench_scale --only live` at two pair counts and divides the differences of the totals by the
# difference of the pairs run (start-up, the L allocations and the warm-up cancel out). The
# simulated last level is LL_BYTES: 32 MiB by default (the development VM's nominal L3); 2097152
# models what that VM actually keeps (a dependent load past ~2 MiB costs a DRAM trip there:
# bench_scale's latency line), so its misses are the DRAM trips a pair makes.
#   benchmarks/cachegrind_churn.sh [BUILD_DIR] [LIVE,LIVE,...] [LL_BYTES]
#   (default build, 1000,1000000, 33554432; CHURN_N1 / CHURN_N2: the pair counts, 20000 / 60000)
# Needs valgrind. Prints a table: live blocks, mode, instructions, L1 data misses and last-level
# misses per churn pair.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
lives=${2:-1000,1000000}
ll=${3:-33554432}
[[ $ll =~ ^[0-9]+$ ]] || { echo "cachegrind_churn.sh: LL_BYTES must be a number of bytes, not '$ll'" >&2; exit 2; }
bench="$build/benchmarks/bench_scale"
[ -x "$bench" ] || { echo "cachegrind_churn.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "cachegrind_churn.sh: valgrind is not installed" >&2; exit 1; }
n1=${CHURN_N1:-20000}; n2=${CHURN_N2:-60000} # the two pair counts
[[ $n1 =~ ^[0-9]+$ && $n2 =~ ^[0-9]+$ && $n2 -gt $n1 ]] || { echo "cachegrind_churn.sh: CHURN_N1 and CHURN_N2 must be numbers, CHURN_N1 < CHURN_N2" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# One run: per child (classic, then expandable: bench_scale forks them in that order), the
# totals "Ir D1misses LLmisses".
totals() { # live pairs
  rm -f "$tmp"/cg.*
  valgrind --tool=cachegrind --cache-sim=yes --LL="$ll",16,64 --cachegrind-out-file="$tmp/cg.%p" \
    "$bench" --reps 1 --only live --live "$1" --pairs "$2" >/dev/null 2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
  # The parent has the lowest pid; its children follow in the order they were forked.
  for f in $(ls "$tmp"/cg.* | sort -t. -k2 -n | tail -n +2); do
    awk '/^events:/ { for (i = 2; i <= NF; i++) ev[i - 1] = $i }
         /^summary:/ { for (i = 2; i <= NF; i++) v[ev[i - 1]] = $i }
         END { print v["Ir"], v["D1mr"] + v["D1mw"], v["DLmr"] + v["DLmw"] }' "$f"
  done
}

printf "%-12s %-11s %14s %14s %14s\n" "live blocks" mode "instructions" "L1d misses" "LL misses"
for live in ${lives//,/ }; do
  mapfile -t a < <(totals "$live" $n1)
  mapfile -t b < <(totals "$live" $n2)
  modes=(classic expandable)
  for k in 0 1; do
    # Each run makes `pairs` warm-up pairs and `pairs` measured ones.
    read -r -a x <<<"${a[$k]}"
    read -r -a y <<<"${b[$k]}"
    awk -v l="$live" -v m="${modes[$k]}" -v d=$((2 * (n2 - n1))) \
      -v i="$((y[0] - x[0]))" -v m1="$((y[1] - x[1]))" -v m2="$((y[2] - x[2]))" \
      'BEGIN { printf "%-12s %-11s %14.0f %14.1f %14.1f\n", l, m, i / d, m1 / d, m2 / d }'
  done
done
