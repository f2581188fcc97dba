#!/usr/bin/env bash
# Stage 1: build against the real libcuda.so.1 (-Demulator=false) and run every meson test on
# the driver, one at a time (the tests share the device and compare cuMemGetInfo exactly). The
# conformance rows of tests/driver become checks of their own: a row whose driver result differs
# from what cudaemu returns is a cudaemu bug. --quick: the driver suite only.
set -uo pipefail
. "$XSEG_GPU_ROOT/benchmarks/gpu/lib.sh"
cd "$XSEG_GPU_ROOT"
W=$XSEG_GPU_WORK
B=$XSEG_GPU_BUILD

if ensure_build; then
    check build pass "$(tail -1 "$W/ninja.log" 2>/dev/null)"
else
    check build fail "$(tail -30 "$W/meson-setup.log" "$W/ninja.log" 2>/dev/null)"
    exit 0
fi
# Which driver the tests load: the emulator build points XSEG_LIBCUDA at cudaemu itself.
grep -q "option('emulator'" meson_options.txt && meson introspect "$B" --buildoptions 2>/dev/null |
    "$PY" -c 'import json,sys; print("emulator option:", [o["value"] for o in json.load(sys.stdin) if o["name"] == "emulator"])' \
    >> "$W/env.txt" 2>&1

# XSEG_GPU_TEST_ARGS: other arguments for meson test (e.g. "--suite alloc" when the whole
# suite does not fit one call: run stage 1 once per group of suites).
if [ "$XSEG_GPU_QUICK" = 1 ]; then
    set -- --suite driver
else
    set -- ${XSEG_GPU_TEST_ARGS:-}
fi
# --logbase: its own log beside meson's (the CI dry run runs inside `meson test` of the same build).
# Stopped before the stage's limit: meson's log keeps every test that finished.
left=$(time_left)
timeout --kill-after=10 "$left" meson test -C "$B" --no-rebuild --logbase gpu-stage1 --num-processes 1 \
    --print-errorlogs --timeout-multiplier 2 "$@" > "$W/tests.log" 2>&1
rc=$?
echo "meson test exited $rc" >> "$W/tests.log"
[ $rc = 124 ] && check "meson test time" fail "stopped after $left s: the tests after the last one listed did not run (XSEG_GPU_TEST_ARGS splits the suite)"
cp "$B/meson-logs/gpu-stage1.json" "$W/testlog.json" 2>/dev/null
if [ -s "$W/testlog.json" ]; then
    "$PY" "$XSEG_GPU_ROOT/benchmarks/gpu/summary.py" tests "$W" "$W/testlog.json"
else
    check "meson test" fail "no test log: $(tail -5 "$W/tests.log")"
fi
# Which of cudaemu's entry points no conformance test compares with the driver (data only).
if [ -f "$B/cudaemu/libcudaemu.so" ] && command -v nm >/dev/null; then
    "$PY" "$GPU_DIR/summary.py" rows-cover "$W" "$B/cudaemu/libcudaemu.so" tests/driver/test_vmm.c \
        2>> "$W/stage.log" || echo "rows-cover failed" >> "$W/stage.log"
fi
exit 0
