#!/usr/bin/env bash
# Check driver: the driver suite (tests/driver) on the real libcuda.so.1, one test at a time,
# each under a limit of its own (lib.sh's meson_tests).
# Each conformance row it prints becomes an item: a row whose driver result differs from what
# cudaemu returns is a cudaemu bug. Also which of cudaemu's entry points no row names (data).
set -uo pipefail
. "$XSEG_GPU_ROOT/benchmarks/gpu/lib.sh"
cd "$XSEG_GPU_ROOT"
W=$XSEG_GPU_WORK
B=$XSEG_GPU_BUILD
# Which driver the tests load: the emulator build points XSEG_LIBCUDA at cudaemu itself.
meson introspect "$B" --buildoptions 2>/dev/null |
    "$PY" -c 'import json,sys; print("emulator option:", [o["value"] for o in json.load(sys.stdin) if o["name"] == "emulator"])' \
    > "$W/options.txt" 2>&1
# --logbase: its own log beside meson's (the CI dry run runs inside `meson test` of the same build).
# Stopped before the check's limit: meson's log keeps every test that finished.
left=$(time_left)
meson_tests "$left" gpu-driver "$W/tests.log" "$W/testlog.json" --suite driver
rc=$?
echo "meson test exited $rc" >> "$W/tests.log"
[ $rc = 124 ] && check "driver suite time" fail "stopped after $left s: the tests after the last one listed did not run"
if [ -s "$W/testlog.json" ]; then
    summarize tests "$W/testlog.json"
else
    check "meson test --suite driver" fail "no test log: $(tail -5 "$W/tests.log")"
fi
# Which of cudaemu's entry points no conformance test compares with the driver (data only).
if [ -f "$B/cudaemu/libcudaemu.so" ] && command -v nm >/dev/null; then
    "$PY" "$GPU_DIR/summary.py" rows-cover "$W" "$B/cudaemu/libcudaemu.so" tests/driver/*.c \
        2>> "$W/rows-cover.log" || echo "rows-cover failed" >> "$W/rows-cover.log"
fi
exit 0
