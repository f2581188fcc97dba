#!/usr/bin/env bash
# Check build: meson setup and ninja of build-gpu (-Demulator=false: the tests load the real
# libcuda.so.1) on every core; the other checks use this build and are not reached without it.
set -uo pipefail
. "$XSEG_GPU_ROOT/benchmarks/gpu/lib.sh"
cd "$XSEG_GPU_ROOT"
W=$XSEG_GPU_WORK
if ensure_build; then
    check build pass "$(tail -1 "$W/ninja.log" 2>/dev/null)"
else
    check build fail "$(tail -30 "$W/meson-setup.log" "$W/ninja.log" 2>/dev/null)"
fi
exit 0
