#!/usr/bin/env bash
# The fit table: for the bundled workloads, and for recorded PyTorch snapshots when FIT_TRACES
# names a folder of them (*.pickle, converted with tools/snapshot2trace.py), the smallest
# emulated device the replay fits on (no failed allocation; `xseg-replay --min-device`, 64 MiB
# steps) as a ratio to peak allocated, one column per configuration.
# The six snapshots of docs/benchmarks-replay.md are third-party data, not shipped here: they are
# the memory_*.pickle files of the public GitHub repository kkaitlyn111/cs336-a2-systems, folder
# memory_files/ (clone it, then FIT_TRACES=/path/to/cs336-a2-systems/memory_files).
#   benchmarks/fit_table.sh [BUILD_DIR]                      (default build; bundled workloads only)
#   FIT_TRACES=DIR benchmarks/fit_table.sh                   (DIR's snapshots too)
#   FIT_MODES='name=config;name=config' benchmarks/fit_table.sh   (other columns)
# Needs python3 for the conversion. Replays run on cudaemu, whose placements repeat exactly.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
replay="$build/tools/xseg-replay"
[ -x "$replay" ] || { echo "fit_table.sh: $replay not built (ninja -C $build)" >&2; exit 1; }
traces_dir=${FIT_TRACES:-}
if [ -n "$traces_dir" ] && [ ! -d "$traces_dir" ]; then
  echo "fit_table.sh: FIT_TRACES=$traces_dir is not a folder" >&2; exit 1
fi
modes=${FIT_MODES:-"classic=expandable_segments:False;expandable (default)=expandable_segments:True;expandable, 2 MiB pages=expandable_segments:True,expandable_page_size_mb:2;expandable, 4 MiB pages=expandable_segments:True,expandable_page_size_mb:4;expandable, recycling off=expandable_segments:True,expandable_segments_recycle:False"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

specs=()
if [ -n "$traces_dir" ]; then
  for f in "$traces_dir"/*.pickle; do
    [ -e "$f" ] || continue
    b=$(basename "$f" .pickle); b=${b#memory_}
    /usr/bin/env python3 tools/snapshot2trace.py "$f" > "$tmp/$b.trace"
    specs+=("$tmp/$b.trace")
  done
fi
specs+=(builtin:training builtin:inference)

IFS=';' read -r -a cols <<<"$modes"
header="| trace |"; rule="|---|"
for col in "${cols[@]}"; do header+=" ${col%%=*} |"; rule+="---|"; done
echo "$header"; echo "$rule"
for spec in "${specs[@]}"; do
  name=$(basename "$spec" .trace)
  row="| $name |"
  for col in "${cols[@]}"; do
    cfg=${col#*=}
    r=$("$replay" --min-device --summary=json --config "$cfg" "$spec" 2>/dev/null \
        | sed -n 's/.*"ratio":\([0-9.]*\).*/\1/p' | awk '{ printf "%.3f", $1 }')
    row+=" ${r:-fail} |"
  done
  echo "$row"
done
