#!/usr/bin/env bash
# Many small blocks (issue 74 item 7, docs/benchmarks.md#many-small-blocks): sleep + wake of N live
# blocks of one size, each its own run, 4 KiB to 64 MiB, with one cuMemcpy*Async per run
# (sleep_copy_batch_kb:0, the 64 MiB chunks) against cuMemcpyBatchAsync batches
# (sleep_copy_batch_kb:65536: every run below 64 MiB batched), on cudaemu's timeline model, from
# bench_sleep_batch's medians.
#   benchmarks/sleep_batch_table.sh [BUILD_DIR] [REPS]     (default build, 3)
# The costs (CUDAEMU_LATENCY below): the h200 preset (50 GB/s pinned copies) plus per-call costs
# NOBODY HAS MEASURED: 2 us per cuMemcpyDtoHAsync/HtoDAsync call, 3 us per cuMemcpyBatchAsync call
# and 150 ns per copy in it. Assumed: a single async copy's submission is a few microseconds of host
# time on current drivers, and a batch's is one such submission plus a descriptor per copy. The GPU
# run (benchmarks/gpu, check_services.sh's sleep_batch item) times both paths on the driver.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
reps=${2:-3}
bench="$build/benchmarks/bench_sleep_batch"
[ -x "$bench" ] || { echo "sleep_batch_table.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
export XSEG_LIBCUDA="$PWD/$build/cudaemu/libcudaemu.so" CUDAEMU_TOTAL_MEM=8G
export CUDAEMU_LATENCY="${SLEEP_BATCH_LATENCY:-h200,cuMemcpyDtoHAsync:2us,cuMemcpyHtoDAsync:2us,cuMemcpyBatchAsync:3us,batch_copy:150ns}"
one=$(nice "$bench" 0 "$reps" | grep "^size ")
bat=$(nice "$bench" 65536 "$reps" | grep "^size ")
echo "bench_sleep_batch, $reps repetitions (median), cudaemu, CUDAEMU_LATENCY=$CUDAEMU_LATENCY, $(nproc) CPUs"
echo
echo "| run size | runs | one call per run: modelled ms | its calls | batched: modelled ms | its calls | batched / one call |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
paste -d' ' <(echo "$one") <(echo "$bat") | awk '{
  s = $2; u = s >= 1048576 ? sprintf("%d MiB", s / 1048576) : sprintf("%d KiB", s / 1024)
  printf "| %s | %d | %.2f | %d | %.2f | %d | %.2f |\n", u, $4, $6 / 1000, $10, $16 / 1000, $20, $16 / $6 }'
