#!/usr/bin/env bash
# Run here, after a GPU run came back: the snapshot stage 2 dumped through torch.cuda (inside
# stage2.tgz) through ../shared/tools/memory-viz's checker (PyTorch's own _memory_viz.py and
# MemoryViz.js). The GPU machine has no ../shared, hence afterwards.
# usage: benchmarks/gpu/check_snapshots.sh RESULTS_DIR [SHARED_DIR]   (exit 0: the checker passed)
set -uo pipefail
res=${1:?usage: check_snapshots.sh RESULTS_DIR [SHARED_DIR]}
shared=${2:-$(cd "$(dirname "$0")/../.." && pwd)/../shared}
checker=$shared/tools/memory-viz/check-snapshot
[ -f "$res/stage2.tgz" ] || { echo "check_snapshots: no $res/stage2.tgz (run stage 2 first)"; exit 2; }
[ -x "$checker" ] || { echo "check_snapshots: no checker at $checker"; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tar -C "$tmp" -xzf "$res/stage2.tgz" ./snapshot.pickle 2>/dev/null ||
    { echo "check_snapshots: stage2.tgz holds no snapshot.pickle (see its torch_checks.log)"; exit 1; }
mkdir -p "$res/memory-viz"
"$checker" "$tmp/snapshot.pickle" "$res/memory-viz/snapshot.png" 2>&1 | tee "$res/memory-viz/check.log"
exit "${PIPESTATUS[0]}"
