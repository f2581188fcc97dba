#!/usr/bin/env bash
# Run here, after a GPU run came back: the snapshot the torch check dumped through torch.cuda
# (RESULTS_DIR/snapshot.pickle), and the stale-access mode's (stale_snapshot.pickle) when there is
# one, through ../shared/tools/memory-viz's checker (PyTorch's own _memory_viz.py and
# MemoryViz.js). The GPU machine has no ../shared, hence afterwards.
# usage: benchmarks/gpu/check_snapshots.sh RESULTS_DIR [SHARED_DIR]   (exit 0: the checker passed)
set -uo pipefail
res=${1:?usage: check_snapshots.sh RESULTS_DIR [SHARED_DIR]}
shared=${2:-$(cd "$(dirname "$0")/../.." && pwd)/../shared}
checker=$shared/tools/memory-viz/check-snapshot
[ -f "$res/summary.json" ] || { echo "check_snapshots: no $res/summary.json (not run.sh's results)"; exit 2; }
[ -s "$res/snapshot.pickle" ] ||
    { echo "check_snapshots: no snapshot.pickle in $res (see torch/torch_checks.log in logs.tgz)"; exit 1; }
[ -x "$checker" ] || { echo "check_snapshots: no checker at $checker"; exit 2; }
mkdir -p "$res/memory-viz"
"$checker" "$res/snapshot.pickle" "$res/memory-viz/snapshot.png" 2>&1 | tee "$res/memory-viz/check.log"
rc=${PIPESTATUS[0]}
# The stale-access mode's snapshot (quarantined blocks, a finding), when the run wrote one.
if [ -s "$res/stale_snapshot.pickle" ]; then
    "$checker" "$res/stale_snapshot.pickle" "$res/memory-viz/stale_snapshot.png" 2>&1 |
        tee "$res/memory-viz/check_stale.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit "$rc"
