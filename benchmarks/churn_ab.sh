#!/usr/bin/env bash
# The live-block churn of two builds, alternated: ROUNDS rounds of `bench_scale --only live --live
# LIVE --reps 7` (each cell the median of 7), A then B, each on its own tree's cudaemu; then the
# median ns per pair of each and the median of B / A over the rounds, with the load average of
# each round (wall time on a shared machine moves with it; benchmarks/cachegrind_churn.sh counts
# instructions instead).
#   benchmarks/churn_ab.sh BUILD_A BUILD_B [LIVE] [ROUNDS]      (default 1000000, 6)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: churn_ab.sh BUILD_A BUILD_B [LIVE] [ROUNDS]" >&2; exit 2; }
a=$1 b=$2 live=${3:-1000000} rounds=${4:-6}
for x in "$a" "$b"; do
  [ -x "$x/benchmarks/bench_scale" ] && [ -e "$x/cudaemu/libcudaemu.so" ] ||
    { echo "churn_ab.sh: $x needs benchmarks/bench_scale and cudaemu/libcudaemu.so (ninja -C $x)" >&2; exit 1; }
done
[[ $live =~ ^[0-9]+$ && $rounds =~ ^[0-9]+$ ]] || { echo "churn_ab.sh: LIVE and ROUNDS are numbers" >&2; exit 2; }
cell() { # build -> "classic_ns expandable_ns"
  XSEG_LIBCUDA="$1/cudaemu/libcudaemu.so" "$1/benchmarks/bench_scale" --only live --live "$live" --reps 7 |
    awk -F'|' -v l="$live" '$2 + 0 == l { print $3 + 0, $5 + 0 }'
}
out=$(for r in $(seq "$rounds"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "$r $load $(cell "$a") $(cell "$b")"
done)
echo "round load A_classic A_expandable B_classic B_expandable (ns per pair)"
echo "$out"
echo "$out" | python3 -c '
import statistics as s, sys
rows = [list(map(float, l.split()[1:])) for l in sys.stdin if l.strip()]
med = lambda v: s.median(v)
for i, mode in ((1, "classic"), (2, "expandable")):
    a = [r[i] for r in rows]; b = [r[i + 2] for r in rows]
    q = [y / x for x, y in zip(a, b)]
    print("%s: A %.0f ns, B %.0f ns (medians); B/A %.2f (%.2f-%.2f)" % (mode, med(a), med(b), med(q), min(q), max(q)))
print("load average %.1f-%.1f" % (min(r[0] for r in rows), max(r[0] for r in rows)))'
