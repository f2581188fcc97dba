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

if [ "$XSEG_GPU_QUICK" = 1 ]; then
    set -- --suite driver
else
    set --
fi
# --logbase: its own log beside meson's (the CI dry run runs inside `meson test` of the same build).
meson test -C "$B" --no-rebuild --logbase gpu-stage1 --num-processes 1 --print-errorlogs \
    --timeout-multiplier 2 "$@" > "$W/tests.log" 2>&1
echo "meson test exited $?" >> "$W/tests.log"
cp "$B/meson-logs/gpu-stage1.json" "$W/testlog.json" 2>/dev/null
if [ -s "$W/testlog.json" ]; then
    "$PY" "$XSEG_GPU_ROOT/benchmarks/gpu/summary.py" tests "$W" "$W/testlog.json"
else
    check "meson test" fail "no test log: $(tail -5 "$W/tests.log")"
fi
exit 0
