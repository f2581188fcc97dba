#!/usr/bin/env bash
# Check torch: xseg under real PyTorch. torch_checks.py --group torch first (xseg.torch.enable(),
# torch.compile(mode="reduce-overhead": straight, a branching tree, train and eval steps), torch.cuda.graph
# in a private pool, MemPool, MemPool(allocator=...) over NCCL's ncclMemAlloc or cuMemAlloc,
# record_stream, torch.multiprocessing, memory_stats keys, summary and snapshot through
# torch.cuda, pinned tensors from xseg's host cache on 2.8+, and _dump_snapshot into
# snapshot.pickle, which run.sh puts in $OUT for memory-viz), then with the time left
# tests/python/test_torch_adapter.py (the training loop bit for bit against PyTorch's own
# allocator, stats, resets, graphs, MemPool, the OOM error). Each check and test is an item. On
# the emulator PyTorch skips with its reason and xseg's own snapshot writer runs instead.
set -uo pipefail
. "$XSEG_GPU_ROOT/benchmarks/gpu/lib.sh"
cd "$XSEG_GPU_ROOT"
W=$XSEG_GPU_WORK
B=$XSEG_GPU_BUILD
lib=$B/libxseg.so
export XSEG_LIBRARY=$lib

# The scripts of this check must at least compile, everywhere.
if "$PY" -c 'import sys; [compile(open(f).read(), f, "exec") for f in sys.argv[1:]]' \
        "$GPU_DIR/torch_checks.py" tests/python/torch_adapter_script.py tests/python/compat_torch_script.py \
        2> "$W/py_compile.log"; then
    check "scripts compile" pass
else
    check "scripts compile" fail "$(cat "$W/py_compile.log")"
fi

why=$(torch_reason)
if [ -n "$why" ]; then
    for c in "xseg.torch.enable" 'torch.compile(mode="reduce-overhead")' \
             'torch.compile(mode="reduce-overhead"): a branching cudagraph tree' \
             'torch.compile(mode="reduce-overhead"): train and eval steps of two shapes' \
             "torch.cuda.graph" "torch.cuda.MemPool" "torch.cuda.MemPool(allocator=CUDAPluggableAllocator)" \
             "torch.cuda.MemPool over managed memory" "torch.distributed._symmetric_memory pool" \
             "torch.multiprocessing" "record_stream of an empty tensor and of foreign memory" \
             "fraction, history flag, MemPool.snapshot, torch.accelerator" \
             "stats, summary and snapshot through torch.cuda" "torch.cuda.memory._dump_snapshot" \
             "pinned tensors from xseg's host cache" \
             "tests/python/test_torch_adapter.py (training loop bit for bit, graph, MemPool, OOM)"; do
        check "$c" skip "$why"
    done
    # torch_checks.py's "xseg.compat: CASE" items, one per case of compat_torch_script.py
    for c in $("$PY" tests/python/compat_torch_script.py --list); do
        check "xseg.compat: $c" skip "$why"
    done
    if [ "$XSEG_GPU_EMULATOR" = 1 ]; then
        "$PY" "$GPU_DIR/torch_checks.py" --group snapshot-emulator --lib "$lib" --out "$W" > "$W/torch_checks.log" 2>&1
        summarize lines "$W/torch_checks.log" torch_checks
    fi
    exit 0
fi

# torch_checks.py: most of the time (torch.compile is slow the first time), keeping a third for
# pytest; what it leaves goes to pytest.
quick=(); [ "$XSEG_GPU_QUICK" = 1 ] && quick=(--quick)
timeout --kill-after=5 "$(time_left $(( $(time_left) / 3 )))" "$PY" "$GPU_DIR/torch_checks.py" --group torch --lib "$lib" \
    --out "$W" "${quick[@]}" > "$W/torch_checks.log" 2>&1
echo "torch_checks.py exited $?" >> "$W/torch_checks.log"
summarize lines "$W/torch_checks.log" torch_checks
[ -s "$W/snapshot.pickle" ] || check "snapshot kept for memory-viz" fail "torch_checks.py wrote no snapshot.pickle"

# pytest: the image's, or the one carried in .gpu-deps (lib.sh).
if ! has_time 20; then
    check "tests/python/test_torch_adapter.py" not-reached "torch_checks.py used the check's time"
elif run_pytest 60 --version > "$W/pytest-version.log" 2>&1; then
    run_pytest "$(time_left)" tests/python/test_torch_adapter.py -rs --junitxml="$W/pytest.xml" > "$W/pytest.log" 2>&1
    echo "pytest exited $?" >> "$W/pytest.log"
    if [ -s "$W/pytest.xml" ]; then
        summarize junit "$W/pytest.xml" pytest
    else
        check "tests/python/test_torch_adapter.py" fail "pytest wrote no report: $(tail -5 "$W/pytest.log")"
    fi
else
    check "tests/python/test_torch_adapter.py" skip "no pytest here and none in .gpu-deps (benchmarks/gpu/prepare.sh)"
fi
# The documentation's PyTorch and CuPy examples (tests/python/test_doc_examples.py's torch and cupy
# blocks): the suites check runs that file with the system Python, which has no PyTorch, so they
# run here, with PyTorch's Python, an item each.
if ! has_time 20; then
    check "tests/python/test_doc_examples.py (torch and cupy blocks)" not-reached "the adapter's tests used the check's time"
elif run_pytest 60 --version > /dev/null 2>&1; then
    XSEG_BUILD_ROOT=$B run_pytest "$(time_left)" tests/python/test_doc_examples.py -k "torch or cupy" -rs \
        --junitxml="$W/pytest-docs.xml" > "$W/pytest-docs.log" 2>&1
    echo "pytest exited $?" >> "$W/pytest-docs.log"
    if [ -s "$W/pytest-docs.xml" ]; then
        summarize junit "$W/pytest-docs.xml" pytest-docs
    else
        check "tests/python/test_doc_examples.py (torch and cupy blocks)" fail "pytest wrote no report: $(tail -5 "$W/pytest-docs.log")"
    fi
fi
exit 0
