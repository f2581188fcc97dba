#!/usr/bin/env bash
# Instructions per mixed-size malloc+free pair on a lane (Note [front lane], core/device/fast.h)
# and on a stream slot, repeatable on a noisy machine: one thread of bench_scale cycling four sizes
# (512 B - 2 KiB), under callgrind counting only inside xseg_malloc and xseg_free
# (--toggle-collect), at two pair counts; the difference of the worker thread's totals divided by
# the difference of the counts (start-up and warm-up cancel out).
#   benchmarks/callgrind_lane_pair.sh [BUILD_DIR]          (default build-cg)
# Two rows a mode:
#   lane         --same-stream --room 1024: the main thread's room fills the stream's slot, so the
#                worker marks the stream shared and its sizes take lanes. The build must keep them:
#                compiled with -DFRONT_CHECK_HITS=4000000000u, no check-in fades the mark
#                  meson setup build-cg -Dc_args=-DFRONT_CHECK_HITS=4000000000u -Dtests=disabled
#                (in a default build the first check-in, 4,096 hits on, fades it: stream slot).
#   stream slot  no room: the worker alone on its stream, its stream slot serving every size.
# One thread, so callgrind's serialized threads change nothing; two threads' lanes cost the same
# per pair once their stream is marked, which under callgrind depends on how it interleaves them.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cg}
[ -x "$build/benchmarks/bench_scale" ] || { echo "callgrind_lane_pair.sh: $build/benchmarks/bench_scale not built (ninja -C $build)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "callgrind_lane_pair.sh: valgrind is not installed" >&2; exit 1; }
n1=100000; n2=200000
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# totals ARGS...: for each child (classic, then expandable), the worker thread's instructions
# inside xseg_malloc and xseg_free at n1 pairs, then at n2 pairs: "c1 e1 c2 e2"
totals() {
  local n out=()
  for n in $n1 $n2; do
    rm -f "$tmp"/cg.*
    valgrind --tool=callgrind --fair-sched=yes --separate-threads=yes --trace-children=yes \
      --toggle-collect=xseg_malloc --toggle-collect=xseg_free --callgrind-out-file="$tmp/cg.%p" \
      "$build/benchmarks/bench_scale" --only threads --threads 1 --mixed --pairs $n --reps 1 "$@" \
      >/dev/null 2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
    # thread 2 of each child is its worker (thread 1 its main thread); children by pid
    local f files=()
    mapfile -t files < <(ls "$tmp"/cg.*-02 2>/dev/null | sort -t. -k2 -n)
    [ ${#files[@]} -eq 2 ] || { echo "callgrind_lane_pair.sh: expected two children's worker profiles, found ${#files[@]}" >&2; exit 1; }
    for f in "${files[@]}"; do
      out+=("$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')")
    done
  done
  echo "${out[@]}"
}

printf "%-11s %-12s %18s\n" mode pair "instructions/pair"
for row in lane stream; do
  if [ $row = lane ]; then t=($(totals --same-stream --room 1024)); name=lane; else t=($(totals)); name="stream slot"; fi
  printf "%-11s %-12s %18.1f\n" classic "$name" "$(echo "(${t[2]} - ${t[0]}) / ($n2 - $n1)" | bc -l)"
  printf "%-11s %-12s %18.1f\n" expandable "$name" "$(echo "(${t[3]} - ${t[1]}) / ($n2 - $n1)" | bc -l)"
done
