#!/usr/bin/env bash
# The GPU acceptance run: proves the whole project on a real device, in four stages that each fit
# one command of at most 10 minutes (benchmarks/gpu/README.md says what to run there, in order).
#   1 tests     build against the real libcuda.so.1; every meson test, one at a time; the
#               conformance rows of tests/driver (where the driver disagrees, cudaemu is wrong)
#   2 torch     the real-PyTorch checks: tests/python on the real driver, the adapter's training
#               loop bit for bit against PyTorch's allocator, graphs, torch.compile, MemPool,
#               torch.multiprocessing, stats/summary/snapshot through torch.cuda
#   3 frag      every trace of .gpu-traces through real tensors under PyTorch's allocators and
#               xseg: peak reserved, smallest memory fraction, stream syncs; the training loop
#   4 services  sleep/wake, a graph replayed after wake, trim, VMM call costs, IPC between two
#               processes, peer access
# Each stage writes $OUT/stageN.json (its summary: one pass/fail/skip line per check) and
# $OUT/stageN.tgz (its raw logs); benchmarks/gpu/tables.py turns the summaries into the tables of
# docs/benchmarks.md.
#
# usage: run.sh [--emulator] [--quick] [--stage N|all] [--resume] [--build DIR]
#        (run.sh tests|bench|all, the earlier form: stage 1, stages 3 and 4, everything)
#   --emulator  run on cudaemu (the CI dry run: the PyTorch parts skip with their reason)
#   --quick     a few seconds per stage: a subset of each (the dry run uses it)
#   --stage     one stage (1-4) or all (default)
#   --resume    skip the stages whose complete summary is already in $OUT
#   --build     an existing build folder (default build-gpu, -Demulator=false; build-gpu-emu)
# $OUT: where the results go (default ./gpu-results; a new temporary folder with --emulator).
# Exit status: 0 when no check failed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
emulator=0 quick=0 stage=all resume=0 build=""
while [ $# -gt 0 ]; do
    case $1 in
        --emulator) emulator=1 ;;
        --quick) quick=1 ;;
        --stage) stage=${2:-}; shift ;;
        --stage=*) stage=${1#--stage=} ;;
        --resume) resume=1 ;;
        --build) build=${2:-}; shift ;;
        --build=*) build=${1#--build=} ;;
        # The earlier interface (docs/gpu-h100 was made with it): tests, bench, all.
        tests) stage=1 ;;
        bench) stage=bench ;;
        all) stage=all ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case $stage in
    all) stages="1 2 3 4" ;;
    1|2|3|4) stages=$stage ;;
    bench) stages="3 4" ;;
    *) echo "run.sh: --stage takes 1, 2, 3, 4 or all, not '$stage'" >&2; exit 2 ;;
esac
if [ -z "${OUT:-}" ]; then
    if [ $emulator = 1 ]; then OUT=$(mktemp -d "${TMPDIR:-/tmp}/xseg-gpu-run.XXXXXX"); else OUT=$ROOT/gpu-results; fi
fi
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
export XSEG_GPU_BUILD_GIVEN=$([ -n "$build" ] && echo 1 || echo 0)
[ -n "$build" ] || build=$ROOT/build-gpu$([ $emulator = 1 ] && echo -emu)
export XSEG_GPU_ROOT=$ROOT XSEG_GPU_EMULATOR=$emulator XSEG_GPU_QUICK=$quick
export XSEG_GPU_BUILD=$(cd "$(dirname "$build")" && pwd)/$(basename "$build")
export PYTHONDONTWRITEBYTECODE=1
# PyTorch and the real-driver builds must load libcuda.so.1; only the emulator run sets this.
[ $emulator = 1 ] || unset XSEG_LIBCUDA
[ $emulator = 0 ] || export XSEG_LIBCUDA=${XSEG_LIBCUDA:-$XSEG_GPU_BUILD/cudaemu/libcudaemu.so}
. "$ROOT/benchmarks/gpu/lib.sh"
names=(x tests torch frag services)
# A stage's own limit, under the device tool's 10 minutes a command (setup time included).
# XSEG_GPU_STAGE_LIMIT overrides it (the dry-run test uses a tiny one).
limit=${XSEG_GPU_STAGE_LIMIT:-$([ $quick = 1 ] && echo 120 || echo 540)}
echo "run.sh: $([ $emulator = 1 ] && echo "emulator dry run" || echo "real driver"), stages $stages, results in $OUT"

failed=0
for n in $stages; do
    if [ $resume = 1 ] && "$PY" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["complete"] else 1)' \
            "$OUT/stage$n.json" 2>/dev/null; then
        echo "run.sh: stage $n already complete in $OUT (--resume)"
        continue
    fi
    export XSEG_GPU_WORK=$(mktemp -d "${TMPDIR:-/tmp}/xseg-gpu-stage$n.XXXXXX")
    {
        date -u; uname -a
        nvidia-smi 2>&1 | head -20
        nvcc --version 2>&1 | tail -1
        "$PY" -c 'import sys; print("python", sys.version.split()[0])'
        "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
        git -C "$ROOT" log -1 --oneline 2>&1
    } > "$XSEG_GPU_WORK/env.txt" 2>&1
    if ! gpu_deps_env >> "$XSEG_GPU_WORK/env.txt" 2>&1; then
        check "tools from .gpu-deps" fail "unpacking .gpu-deps failed: $(tail -1 "$XSEG_GPU_WORK/env.txt")"
    fi
    # The stage runs in its own process group under the limit, so its summary is written anyway;
    # its long steps stop themselves before it (XSEG_GPU_DEADLINE) and keep what they measured.
    export XSEG_GPU_DEADLINE=$(( $(date +%s) + limit ))
    timeout --kill-after=10 "$limit" bash "$ROOT/benchmarks/gpu/stage${n}_${names[$n]}.sh" \
        > "$XSEG_GPU_WORK/stage.log" 2>&1
    rc=$?
    if [ $rc = 124 ] || [ $rc = 137 ]; then
        "$PY" "$GPU_DIR/summary.py" finish "$XSEG_GPU_WORK" "$n" "${names[$n]}" "$OUT" --timed-out "$limit"
    else
        [ $rc = 0 ] || check "stage script" fail "stage${n}_${names[$n]}.sh exited $rc (see stage.log)"
        "$PY" "$GPU_DIR/summary.py" finish "$XSEG_GPU_WORK" "$n" "${names[$n]}" "$OUT"
    fi
    "$PY" -c 'import json,sys; sys.exit(1 if json.load(open(sys.argv[1]))["counts"]["fail"] else 0)' \
        "$OUT/stage$n.json" || failed=1
    tar -C "$XSEG_GPU_WORK" -czf "$OUT/stage$n.tgz" --exclude=./checks.jsonl --exclude=./data .
    rm -rf "$XSEG_GPU_WORK"
done
echo "run.sh: results in $OUT ($(cd "$OUT" && ls | tr '\n' ' '))"
exit $failed
