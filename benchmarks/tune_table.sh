#!/usr/bin/env bash
# The --tune table of docs/benchmarks-replay.md: for each trace, what `xseg-replay --tune`
# predicts: PyTorch's default config (the baseline, from the same run), the best
# PYTORCH_CUDA_ALLOC_CONF line and the best XSEG_ALLOC_CONF line, each with its peak reserved and
# smallest device (2 MiB bisection; "<=" where the budget cut the bisection short).
#   benchmarks/tune_table.sh [BUILD_DIR] TRACE...     (default build)
# TRACE: builtin:NAME, a trace file, or a PyTorch snapshot (*.pickle, converted here with
# tools/snapshot2trace.py). TUNE_BUDGET: --tune-budget (default 60s). Replays run on cudaemu,
# whose placements repeat exactly; needs /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
if [ $# -gt 0 ] && [ -d "$1" ]; then build=$1; shift; fi
replay="$build/tools/xseg-replay"
[ -x "$replay" ] || { echo "tune_table.sh: $replay not built (ninja -C $build)" >&2; exit 1; }
[ $# -gt 0 ] || { echo "usage: benchmarks/tune_table.sh [BUILD_DIR] TRACE..." >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "| trace | PyTorch default: reserved / smallest device (GiB) | best PYTORCH_CUDA_ALLOC_CONF | reserved / device | best XSEG_ALLOC_CONF | reserved / device | replays, s |"
echo "|---|---|---|---|---|---|---|"
for spec in "$@"; do
  t=$spec
  if [[ $spec == *.pickle ]]; then
    t="$tmp/$(basename "$spec" .pickle).trace"
    /usr/bin/python3 tools/snapshot2trace.py "$spec" >"$t"
  fi
  "$replay" --tune --tune-budget "${TUNE_BUDGET:-60s}" --summary=json --marks=none "$t" 2>"$tmp/err" |
    /usr/bin/python3 -c '
import json, sys
name = sys.argv[1]
rows = [json.loads(l) for l in sys.stdin if l.startswith("{\"tune\"")]
if not rows:
    sys.exit("tune_table.sh: no --tune result for %s (its messages follow)" % name)
# A family with no replay finished within the budget has no rows (the last row lists it).
none = {"config": "(no replay within the budget)", "peak_reserved_bytes": None}
get = lambda fam, rank: next((r for r in rows if r.get("family") == fam and r.get("rank") == rank), none)
def figs(r):
    if r["peak_reserved_bytes"] is None:
        return "-"
    d = r["min_device_bytes"]
    dev = "-" if d is None else ("" if r["min_device_exact"] else "<= ") + "%.2f" % (d / 2**30)
    return "%.2f / %s" % (r["peak_reserved_bytes"] / 2**30, dev)
end = rows[-1]
line = lambda r: "`%s`" % r["config"] if r["config"] and r["peak_reserved_bytes"] is not None else r["config"] or "(unset)"
print("| %s | %s | %s | %s | %s | %s | %d, %.0f |" % (
    name, figs(get("pytorch", "default")), line(get("pytorch", "best")), figs(get("pytorch", "best")),
    line(get("xseg", "best")), figs(get("xseg", "best")), end["replays"], end["seconds"]))
' "$(basename "$spec")" || { cat "$tmp/err" >&2; exit 1; }
done
