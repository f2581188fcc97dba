#!/usr/bin/env bash
# The GPU acceptance run: every check in one command that fits the device tool's 10 minutes,
# in order of value, each under its time share, stopping cleanly before the budget.
#   build     build against the real libcuda.so.1 (parallel)
#   driver    the driver suite (tests/driver): each conformance row compares the driver's answer
#             with cudaemu's (where they differ, cudaemu is wrong)
#   torch     xseg.torch.enable() in real PyTorch: torch.compile(mode="reduce-overhead"), graphs in
#             a private pool, MemPool, record_stream, memory_stats keys, _dump_snapshot
#             (snapshot.pickle), then tests/python/test_torch_adapter.py (the training loop bit
#             for bit against PyTorch's allocator)
#   suites    the test suites on the driver, most valuable first (alloc, services, history,
#             python, ...), as far as the share allows; the rest "not reached"; each test under a
#             limit of its own (a hang costs seconds: test_limit.py)
#   services  sleep/wake GiB/s, time to a kernel after wake, a graph replayed after wake, trim;
#             VMM call costs, the remap of a kept handle; IPC between two processes
#   probes    host-located VMM memory read and written by a kernel, one physical handle mapped
#             at many addresses, a dma-buf export: supported or not, in the driver's words
#   frag      the traces of .gpu-traces through real tensors under PyTorch's allocators and xseg
# A check is given min(its share of the budget, what is left of the budget); one that cannot
# start with 10 s left is "not reached". $OUT gets at most four files: summary.json (one line per
# check: pass/fail/skip/not-reached, its reason, its items, its figures under data), logs.tgz,
# snapshot.pickle (the torch check's _dump_snapshot, for memory-viz) and stale_snapshot.pickle (its
# debug_stale_access snapshot with a finding, for memory-viz too).
#
# usage: run.sh [--budget SECONDS] [--resume DIR] [--share CHECK=FRACTION]... [--emulator] [--quick]
#               [--build DIR]
#   --budget    the whole run's seconds (default 540: the device tool's 600 s less its start)
#   --resume    run only the checks DIR/summary.json marks failed or not reached (and the build);
#               the new summary keeps the others from it (a suite that passed is not run again)
#   --share     a check's share of the budget (defaults below), e.g. --share suites=0.5
#   --emulator  run on cudaemu (the CI dry run: what needs PyTorch or kernels skips, with why)
#   --quick     a small part of each check (the dry run uses it)
#   --build     an existing build folder (default build-gpu, -Demulator=false; build-gpu-emu)
# $OUT: where the files go (default ./gpu-results; a new temporary folder with --emulator).
# XSEG_GPU_TEST_SLEEP=CHECK=SECONDS[,...]: a test-only hook, the named checks sleep that long
# first (gpu-dry-run proves the cut-off and --resume with it).
# Exit status: 0 when no check failed (not reached is no failure), 1 otherwise, 2 bad usage.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CHECKS=(build driver torch suites services probes frag)
# Shares of the budget, oversubscribed on purpose: most checks end well inside theirs, and the
# time they leave goes to the next ones in order of value. Sized from the first H200 run
# (benchmarks/gpu/README.md): build 12 s, driver 4 s, suites ~250 s (alloc and services 143 s,
# the other suites' share estimated from cudaemu), services 26 s, probes 1 s; a hung test costs
# at most 90 s (its own limit, test_limit.py), so the suites' share holds one.
declare -A SHARE=([build]=0.10 [driver]=0.05 [torch]=0.25 [suites]=0.50 [services]=0.12 [probes]=0.04 [frag]=0.35)
emulator=0 quick=0 budget=540 resume="" build=""
usage() { echo "run.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --emulator) emulator=1 ;;
        --quick) quick=1 ;;
        --budget) budget=${2:-}; shift ;;
        --budget=*) budget=${1#--budget=} ;;
        --resume) resume=${2:-}; shift ;;
        --resume=*) resume=${1#--resume=} ;;
        --share|--share=*)
            if [ "$1" = --share ]; then kv=${2:-}; shift; else kv=${1#--share=}; fi
            k=${kv%%=*} v=${kv#*=}
            [ -n "${SHARE[$k]:-}" ] || usage "--share: no check named '$k' (${CHECKS[*]})"
            [[ $v =~ ^(0?\.[0-9]+|1(\.0*)?)$ ]] || usage "--share $k: a fraction of the budget in (0, 1], not '$v'"
            SHARE[$k]=$v ;;
        --build) build=${2:-}; shift ;;
        --build=*) build=${1#--build=} ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) usage "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
[[ $budget =~ ^[0-9]+$ ]] && [ "$budget" -ge 30 ] && [ "$budget" -le 3600 ] ||
    usage "--budget takes whole seconds from 30 to 3600, not '$budget'"
# Relative paths (--resume, --build, $OUT) are the caller's; from here on the root is the cwd.
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
[ -z "$resume" ] || resume=$(abs "$resume")
[ -z "$build" ] || build=$(abs "$build")
[ -z "${OUT:-}" ] || OUT=$(abs "$OUT")
cd "$ROOT" || exit 2
previous=""
if [ -n "$resume" ]; then
    previous=$resume/summary.json
    [ -f "$resume" ] && previous=$resume
    [ -s "$previous" ] || usage "--resume $resume: no summary.json there"
    previous=$(cd "$(dirname "$previous")" && pwd)/$(basename "$previous")
fi
# The checks to run: all, or on --resume the build and what the summary marks failed or not reached.
todo=" ${CHECKS[*]} "
if [ -n "$previous" ]; then
    todo=" build $("${PYTHON:-python3}" "$ROOT/benchmarks/gpu/summary.py" todo "$previous" | tr '\n' ' ') " || exit 2
fi
if [ -z "${OUT:-}" ]; then
    if [ $emulator = 1 ]; then OUT=$(mktemp -d "${TMPDIR:-/tmp}/xseg-gpu-run.XXXXXX"); else OUT=$ROOT/gpu-results; fi
fi
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
[ "$previous" = "$OUT/summary.json" ] && usage "--resume: give the earlier results another folder than \$OUT"
export XSEG_GPU_BUILD_GIVEN=$([ -n "$build" ] && echo 1 || echo 0)
[ -n "$build" ] || build=$ROOT/build-gpu$([ $emulator = 1 ] && echo -emu)
export XSEG_GPU_ROOT=$ROOT XSEG_GPU_EMULATOR=$emulator XSEG_GPU_QUICK=$quick XSEG_GPU_PREVIOUS=$previous
export XSEG_GPU_BUILD=$(cd "$(dirname "$build")" && pwd)/$(basename "$build")
export PYTHONDONTWRITEBYTECODE=1
# PyTorch and the real-driver builds must load libcuda.so.1; only the emulator run sets this.
[ $emulator = 1 ] || unset XSEG_LIBCUDA
[ $emulator = 0 ] || export XSEG_LIBCUDA=${XSEG_LIBCUDA:-$XSEG_GPU_BUILD/cudaemu/libcudaemu.so}
. "$ROOT/benchmarks/gpu/lib.sh"

start=$(date +%s)
# The last 15 s are for the summary and logs.tgz, and a check's 5 s of --kill-after.
end=$(( start + budget - 15 ))
RUN=$(mktemp -d "${TMPDIR:-/tmp}/xseg-gpu-run.XXXXXX")
trap 'rm -rf "$RUN"' EXIT
say() { echo "run.sh: $*" | tee -a "$RUN/run.log"; }
say "$([ $emulator = 1 ] && echo "emulator dry run" || echo "real driver"), budget $budget s, checks:$todo(results in $OUT)"
{
    date -u; uname -a
    nvidia-smi 2>&1 | head -20
    nvcc --version 2>&1 | tail -1
    "$PY" -c 'import sys; print("python", sys.version.split()[0])'
    git -C "$ROOT" log -1 --oneline 2>&1
} > "$RUN/env.txt" 2>&1
gpu_deps_ok=1
gpu_deps_env >> "$RUN/env.txt" 2>&1 || gpu_deps_ok=0

declare -A sleep_for=()
IFS=, read -ra hooks <<< "${XSEG_GPU_TEST_SLEEP:-}"
for h in "${hooks[@]}"; do [ -n "$h" ] && sleep_for[${h%%=*}]=${h#*=}; done

build_ok=1
for c in "${CHECKS[@]}"; do
    case $todo in *" $c "*) ;; *) continue ;; esac
    now=$(date +%s)
    left=$(( end - now ))
    if [ $build_ok = 0 ]; then
        "$PY" "$GPU_DIR/summary.py" not-reached "$RUN" "$c" "the build failed"
        say "$c: not reached (the build failed)"
        continue
    fi
    if [ $left -lt 10 ]; then
        "$PY" "$GPU_DIR/summary.py" not-reached "$RUN" "$c" \
            "the budget of $budget s was spent ($(( now - start )) s gone, $left s left before the summary)"
        say "$c: not reached ($left s left)"
        continue
    fi
    share=$("$PY" -c 'import sys; print(max(1, int(float(sys.argv[1]) * int(sys.argv[2]))))' "${SHARE[$c]}" "$budget")
    limit=$(( share < left ? share : left ))
    export XSEG_GPU_WORK=$RUN/$c XSEG_GPU_DEADLINE=$(( now + limit ))
    mkdir -p "$XSEG_GPU_WORK"
    [ $gpu_deps_ok = 1 ] || [ $c != build ] ||
        check "tools from .gpu-deps" fail "unpacking .gpu-deps failed: $(tail -1 "$RUN/env.txt")"
    say "$c: up to $limit s (share $share s, $left s left)"
    # Its own process group under timeout: whatever it leaves running is stopped with it.
    timeout --kill-after=5 "$limit" bash -c '[ "$1" = 0 ] || sleep "$1"; exec bash "$2"' check \
        "${sleep_for[$c]:-0}" "$GPU_DIR/check_$c.sh" > "$XSEG_GPU_WORK/check.log" 2>&1
    rc=$?
    "$PY" "$GPU_DIR/summary.py" finish-check "$RUN" "$c" "$XSEG_GPU_WORK" $rc $limit $(( $(date +%s) - now ))
    if [ $c = build ] && ! tail -1 "$RUN/checks.jsonl" | grep -q '"status": "pass"'; then
        build_ok=0
    fi
    if [ $c = build ] && [ $build_ok = 1 ]; then
        # What the device is (count, VMM and fabric support, peers): the summary's device_info.
        "$PY" "$GPU_DIR/device_probe.py" info > "$RUN/device.json" 2> "$RUN/device.err" || rm -f "$RUN/device.json"
    fi
done

# The files: summary.json, logs.tgz, snapshot.pickle and stale_snapshot.pickle (this run's, else
# the resumed run's).
for snap in snapshot.pickle stale_snapshot.pickle; do
    if [ -s "$RUN/torch/$snap" ]; then
        mv "$RUN/torch/$snap" "$OUT/$snap"
    elif [ -n "$previous" ] && [ -s "$(dirname "$previous")/$snap" ]; then
        cp "$(dirname "$previous")/$snap" "$OUT/$snap"
    fi
done
"$PY" "$GPU_DIR/summary.py" write "$RUN" "$OUT" "$budget" $previous | tee -a "$RUN/run.log"
failed=${PIPESTATUS[0]}
tar -C "$RUN" -czf "$OUT/logs.tgz" --exclude='*/data' --exclude='./checks.jsonl' .
# The device tool brings back files of 16 MiB at most: without meson's JSON logs (their tests'
# output is in the summary's items already) if it is larger.
if [ "$(stat -c %s "$OUT/logs.tgz")" -gt $(( 15 << 20 )) ]; then
    tar -C "$RUN" -czf "$OUT/logs.tgz" --exclude='*/data' --exclude='./checks.jsonl' --exclude='testlog*.json' .
    say "logs.tgz over 15 MiB: written again without the testlog*.json files"
fi
say "$(( $(date +%s) - start )) s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit $failed
