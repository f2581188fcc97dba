#!/usr/bin/env bash
# Stage 2: xseg under real PyTorch. tests/python with pytest on the real driver (among them
# test_torch_adapter.py: a training loop bit for bit against PyTorch's own allocator, stats,
# resets, cuDNN's cache info, torch.cuda.graph, MemPool, the OOM error, a snapshot dump), then
# torch_checks.py --group torch (torch.compile reduce-overhead, torch.multiprocessing, a snapshot
# kept for the memory-viz check run afterwards: check_snapshots.sh; pinned tensors from xseg's
# host cache on PyTorch 2.8+). Each test and check is a
# line of the summary. On the emulator PyTorch skips with its reason; xseg's own snapshot writer
# runs instead, so check_snapshots.sh has a file to check.
set -uo pipefail
. "$XSEG_GPU_ROOT/benchmarks/gpu/lib.sh"
cd "$XSEG_GPU_ROOT"
W=$XSEG_GPU_WORK
B=$XSEG_GPU_BUILD
ensure_build || { check build fail "$(tail -30 "$W/meson-setup.log" "$W/ninja.log" 2>/dev/null)"; exit 0; }
lib=$B/libxseg.so
export XSEG_LIBRARY=$lib

# The scripts of this stage must at least compile, everywhere.
if "$PY" -c 'import sys; [compile(open(f).read(), f, "exec") for f in sys.argv[1:]]' \
        "$GPU_DIR/torch_checks.py" tests/python/torch_adapter_script.py 2> "$W/py_compile.log"; then
    check "scripts compile" pass
else
    check "scripts compile" fail "$(cat "$W/py_compile.log")"
fi

why=$(torch_reason)
if [ -n "$why" ]; then
    for c in "tests/python on the real driver (training loop bit for bit, graph, MemPool, OOM)" \
             'torch.compile(mode="reduce-overhead")' "torch.multiprocessing" \
             "record_stream of an empty tensor and of foreign memory" \
             "fraction, history flag, MemPool.snapshot, torch.accelerator" \
             "stats, summary and snapshot through torch.cuda" "pinned tensors from xseg's host cache"; do
        check "$c" skip "$why"
    done
    if [ "$XSEG_GPU_EMULATOR" = 1 ]; then
        "$PY" "$GPU_DIR/torch_checks.py" --group snapshot-emulator --lib "$lib" --out "$W" > "$W/torch_checks.log" 2>&1
        "$PY" "$GPU_DIR/summary.py" lines "$W" "$W/torch_checks.log" torch_checks
    fi
    exit 0
fi

# pytest: the image's, or the one carried in .gpu-deps (lib.sh). tests/python, whole, on the driver.
if run_pytest 60 --version > "$W/pytest-version.log" 2>&1; then
    pyargs=(tests/python -rs)
    [ "$XSEG_GPU_QUICK" = 1 ] && pyargs=(tests/python/test_torch_adapter.py -rs)
    # Most of the stage, leaving torch_checks.py two minutes.
    run_pytest "$(time_left 120)" "${pyargs[@]}" --junitxml="$W/pytest.xml" > "$W/pytest.log" 2>&1
    echo "pytest exited $?" >> "$W/pytest.log"
    if [ -s "$W/pytest.xml" ]; then
        "$PY" "$GPU_DIR/summary.py" junit "$W" "$W/pytest.xml" pytest
    else
        check "tests/python" fail "pytest wrote no report: $(tail -5 "$W/pytest.log")"
    fi
else
    check "tests/python on the real driver" skip "no pytest here and none in .gpu-deps (benchmarks/gpu/prepare.sh)"
fi

quick=(); [ "$XSEG_GPU_QUICK" = 1 ] && quick=(--quick)
timeout --kill-after=10 $(time_left) "$PY" "$GPU_DIR/torch_checks.py" --group torch --lib "$lib" --out "$W" "${quick[@]}" \
    > "$W/torch_checks.log" 2>&1
echo "torch_checks.py exited $?" >> "$W/torch_checks.log"
"$PY" "$GPU_DIR/summary.py" lines "$W" "$W/torch_checks.log" torch_checks
[ -s "$W/snapshot.pickle" ] || check "snapshot kept for memory-viz" fail "torch_checks.py wrote no snapshot.pickle"
exit 0
