#!/usr/bin/env bash
# The fit tables of docs/benchmarks-replay.md: for every workload, the smallest emulated device
# the replay fits on (no failed allocation; `xseg-replay --min-device`, 2 MiB steps) as a ratio
# to peak allocated, then on an 80 GiB device the utilization, the driver's memory calls (total,
# per GiB reserved), their H100 driver time (each call weighted by its H100 median, the figures
# of cudaemu's CUDAEMU_LATENCY=h100 preset) and the stream synchronizations. One table per
# configuration.
#   benchmarks/fit_table.sh [BUILD_DIR]                                (default build)
#   FIT_TRACES=DIR        a folder of PyTorch snapshots (*.pickle, converted here with
#                         tools/snapshot2trace.py, a table row per device with data) or traces
#                         (*.trace); without it only the
#                         bundled workloads run. The six snapshots of the docs are third-party
#                         data: the memory_*.pickle files of the public GitHub repository
#                         kkaitlyn111/cs336-a2-systems, folder memory_files/ (clone it, then
#                         FIT_TRACES=/path/to/cs336-a2-systems/memory_files).
#   FIT_MODES='name=config;name=config'                                (other configurations)
# Replays run on cudaemu, whose placements repeat exactly; needs /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
replay="$build/tools/xseg-replay"
[ -x "$replay" ] || { echo "fit_table.sh: $replay not built (ninja -C $build)" >&2; exit 1; }
modes=${FIT_MODES:-"classic=expandable_segments:False;expandable (default)=expandable_segments:True;expandable, expandable_segments_defrag:True=expandable_segments:True,expandable_segments_defrag:True;expandable, 4 MiB chunks=expandable_segments:True,expandable_chunk_mb:4"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

specs=()
if [ -n "${FIT_TRACES:-}" ] && [ ! -d "$FIT_TRACES" ]; then
  echo "fit_table.sh: FIT_TRACES=$FIT_TRACES is not a folder" >&2; exit 1
fi
if [ -n "${FIT_TRACES:-}" ]; then
  for f in "$FIT_TRACES"/*.pickle "$FIT_TRACES"/*.trace; do
    [ -e "$f" ] || continue
    case $f in
      *.pickle) b=$(basename "$f" .pickle); b=${b#memory_}
                # every device that holds data: NAME.trace, or NAME-devN.trace when there are several
                mkdir "$tmp/$b.d"
                /usr/bin/python3 tools/snapshot2trace.py --out-dir "$tmp/$b.d" "$f" > "$tmp/$b.list"
                n=$(wc -l < "$tmp/$b.list")
                while IFS=$'\t' read -r dev path _; do
                  t="$tmp/$b.trace"; [ "$n" -gt 1 ] && t="$tmp/$b-dev$dev.trace"
                  mv "$path" "$t"; specs+=("$t")
                done < "$tmp/$b.list" ;;
      *) specs+=("$f") ;;
    esac
  done
  [ ${#specs[@]} -gt 0 ] || echo "fit_table.sh: no *.pickle or *.trace in $FIT_TRACES" >&2
fi
specs+=(builtin:training builtin:inference)

IFS=';' read -r -a cols <<<"$modes"
for col in "${cols[@]}"; do
  name=${col%%=*}; cfg=${col#*=}
  for spec in "${specs[@]}"; do
    "$replay" --min-device --summary=json --config "$cfg" "$spec" 2>/dev/null | tail -n 1
    "$replay" --summary=json --marks=none --config "$cfg" "$spec" 2>/dev/null | tail -n 1
  done > "$tmp/out"
  /usr/bin/python3 - "$name" "$cfg" "$tmp/out" "${specs[@]}" <<'PY'
import json, os, sys
name, cfg, out, specs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
# H100 medians in microseconds (docs/benchmarks.md, "VMM call costs"; CUDAEMU_LATENCY=h100)
us = {"cuMemCreate": 8.6, "cuMemMap": 0.7, "cuMemSetAccess": 21.9, "cuMemUnmap": 15.5,
      "cuMemRelease": 20.4, "cuMemAlloc": 39.0, "cuMemFree": 42.8}
lines = open(out).read().splitlines()
print(f"\n{name} (`{cfg}`)\n")
print("| workload | smallest device / peak allocated | utilization (80 GiB) | driver calls | per GiB "
      "reserved | H100 driver time (ms) | synchronizations |")
print("|---|---|---|---|---|---|---|")
for i, spec in enumerate(specs):
    label = os.path.basename(spec).removesuffix(".trace")
    try:
        fit, run = json.loads(lines[2 * i]), json.loads(lines[2 * i + 1])
    except (IndexError, ValueError):
        print(f"| {label} | failed | | | | | |")
        continue
    calls = run["driver_calls"]
    ms = sum(us.get(k, 0) * v for k, v in calls.items()) / 1000
    gib = run["peak_reserved_bytes"] / 2**30
    syncs = calls.get("cuStreamSynchronize", 0)
    print(f"| {label} | {fit['ratio']:.4f} | {run['utilization']:.4f} | {run['driver_memory_calls']} | "
          f"{run['driver_memory_calls'] / gib:.0f} | {ms:.0f} | {syncs} |")
PY
done
