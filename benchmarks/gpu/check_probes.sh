#!/usr/bin/env bash
# Check probes: what the driver answers to what other issues need (device_probe.py probes):
# host-located VMM memory read and written by a kernel, one physical handle mapped at many
# addresses, a dma-buf fd from cuMemGetHandleForAddressRange. Each item passes when the driver
# answered, "supported" or "not supported" in its own words (data.probes); on the emulator what
# cudaemu cannot do (kernels, dma-buf) is skipped with the reason, the many-address mapping runs.
set -uo pipefail
. "$XSEG_GPU_ROOT/benchmarks/gpu/lib.sh"
cd "$XSEG_GPU_ROOT"
W=$XSEG_GPU_WORK
emu=(); [ "$XSEG_GPU_EMULATOR" = 1 ] && emu=(--emulator)
timeout --kill-after=5 "$(time_left)" "$PY" "$GPU_DIR/device_probe.py" probes --ptx-dir "$W" "${emu[@]}" \
    > "$W/probes.log" 2>&1
rc=$?
echo "device_probe.py probes exited $rc" >> "$W/probes.log"
summarize lines "$W/probes.log" probes
[ $rc = 0 ] || check "device_probe.py probes" fail "exit $rc: $(grep -v '^{' "$W/probes.log" | tail -5)"
exit 0
