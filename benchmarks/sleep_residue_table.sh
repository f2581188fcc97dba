#!/usr/bin/env bash
# The residue table of docs/benchmarks.md#services (issue 74, item 6): the device's free memory
# (cuMemGetInfo) after two pools (the default one and a private one) sleep, against before they
# allocated, and its change per cycle over 1,000 sleep/wake cycles of both, with the pinned host
# memory's change; on cudaemu, from tests/services/test_sleep_contract.c's test_no_residue (which
# asserts the same figures: within one 2 MiB granule per pool, 0 per cycle).
#   benchmarks/sleep_residue_table.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
exe="$build/tests/services/test_sleep_contract"
lib="$build/cudaemu/libcudaemu.so"
[ -x "$exe" ] && [ -f "$lib" ] || { echo "sleep_residue_table.sh: $exe or $lib not built (ninja -C $build)" >&2; exit 1; }
line=$(XSEG_LIBCUDA="$lib" CUDAEMU_TOTAL_MEM=8G "$exe" test_no_residue 2>/dev/null | grep '^residue:')
read -r _ _ cycles _ per _ gap _ pools _ host <<<"$line"
echo "What a sleep leaves on the device (cudaemu, 8 GiB): free memory with both pools asleep against"
echo "before they allocated, and the change per cycle of 1,000 sleep/wake cycles (device and pinned host)."
echo
echo "| pools | free memory asleep, bytes below before | cycles | device bytes left per cycle | pinned host bytes left, all cycles |"
echo "|---|---|---|---|---|"
echo "| $pools | $gap | $cycles | $per | $host |"
