#!/usr/bin/env bash
# On a GPU machine: build xseg, run every test suite against the real libcuda.so.1, then the GPU
# benchmarks. Everything lands in $OUT (default ./gpu-results): summary.txt with the headline
# figures, and results.tgz with every log.
#   benchmarks/gpu/run.sh [tests|bench|all]     (default all)
# Needs: a C compiler, meson + ninja (pip's are fine), cmocka (Debian packages in .gpu-deps/ are
# unpacked into / when present: the GPU image lacks it), nm. PyTorch (a CUDA build) and a C++
# compiler for the comparison parts, which build xseg's PyTorch adapter once (xseg.torch.enable).
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT/logs"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

if ls .gpu-deps/*.deb >/dev/null 2>&1; then
    for f in .gpu-deps/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
command -v meson >/dev/null || export PATH="$(python3 -c 'import sys,os;print(os.path.dirname(sys.executable))'):$PATH"

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    nvcc --version 2>/dev/null | tail -1
    python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
    meson --version; ninja --version; cc --version | head -1
} > "$OUT/logs/env.txt" 2>&1
log "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"

# Two builds: the real driver (tests use libcuda.so.1), and the emulator build for comparison of
# the same suites on the same machine.
if [ ! -f build-gpu/build.ninja ]; then
    meson setup build-gpu -Demulator=false > "$OUT/logs/setup-gpu.txt" 2>&1 || { log "meson setup failed"; cat "$OUT/logs/setup-gpu.txt"; }
fi
ninja -C build-gpu > "$OUT/logs/build-gpu.txt" 2>&1 || { log "build failed"; tail -40 "$OUT/logs/build-gpu.txt"; }

if [ "$what" = all ] || [ "$what" = tests ]; then
    # One test at a time: several suites check cuMemGetInfo exactly, and on a real GPU every
    # process shares the one device, so parallel tests would disturb each other's figures.
    meson test -C build-gpu --print-errorlogs --num-processes 1 --timeout-multiplier 3 \
        > "$OUT/logs/tests-gpu.txt" 2>&1
    cp build-gpu/meson-logs/testlog.json "$OUT/logs/testlog-gpu.json" 2>/dev/null
    log "tests on the real driver: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$OUT/logs/tests-gpu.txt" | tr -s ' ' | tr '\n' ' ')"
    grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|SKIP)' "$OUT/logs/tests-gpu.txt" | tee -a "$OUT/summary.txt"
fi

if [ "$what" = all ] || [ "$what" = bench ]; then
    # The PyTorch comparisons install xseg with xseg.torch.enable(): the package from this tree
    # over the library just built (the scripts find both themselves too), on the real driver.
    pyenv=(env -u XSEG_LIBCUDA PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
           XSEG_LIBRARY="$PWD/build-gpu/libxseg.so")
    if [ -x build-gpu/benchmarks/bench_vmm_costs ]; then
        build-gpu/benchmarks/bench_vmm_costs --csv "$OUT/logs/vmm_costs.csv" > "$OUT/logs/vmm_costs.txt" 2>&1
        log "VMM call costs"; cat "$OUT/logs/vmm_costs.txt" >> "$OUT/summary.txt"
    fi
    if [ -x build-gpu/benchmarks/bench_host_path ]; then
        build-gpu/benchmarks/bench_host_path > "$OUT/logs/host_path.txt" 2>&1
        log "host path on the real driver"; cat "$OUT/logs/host_path.txt" >> "$OUT/summary.txt"
    fi
    if [ -x build-gpu/tools/xseg-replay ]; then
        build-gpu/tools/xseg-replay > "$OUT/logs/replay-bundled.txt" 2>&1
        log "xseg-replay (bundled workloads) on the real driver"; cat "$OUT/logs/replay-bundled.txt" >> "$OUT/summary.txt"
        for t in .gpu-traces/*.trace; do
            [ -f "$t" ] || continue
            build-gpu/tools/xseg-replay --compare "$t" > "$OUT/logs/replay-$(basename "$t" .trace).txt" 2>&1
        done
    fi
    if [ -f benchmarks/gpu/compare_pytorch.py ] && ls .gpu-traces/*.trace >/dev/null 2>&1; then
        "${pyenv[@]}" python3 benchmarks/gpu/compare_pytorch.py --lib build-gpu/libxseg.so .gpu-traces/*.trace \
            > "$OUT/logs/pytorch_compare.txt" 2>&1
        log "PyTorch comparison"; cat "$OUT/logs/pytorch_compare.txt" >> "$OUT/summary.txt"
    fi
    if [ -f benchmarks/gpu/train_transformer.py ]; then
        "${pyenv[@]}" python3 benchmarks/gpu/train_transformer.py --lib build-gpu/libxseg.so \
            > "$OUT/logs/train.txt" 2>&1
        log "training loop"; cat "$OUT/logs/train.txt" >> "$OUT/summary.txt"
    fi
fi
tar -C "$OUT" -czf "$OUT/results.tgz" logs && rm -rf "$OUT/logs"
cat "$OUT/summary.txt"
