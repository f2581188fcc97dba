#!/usr/bin/env bash
# The fit tables of docs/benchmarks-replay.md (issue 33). For every workload and configuration:
#   - peak allocated (replay on an 80 GiB emulated device) and the failed allocations when the
#     same replay runs on a device of peak allocated x 1.01 rounded up to 2 MiB (the "1 %" bar:
#     0 means it fits);
#   - the smallest emulated device above which every size up to FIT_CEILING (default 1.10 x peak
#     allocated) replays with no failed allocation (`xseg-replay --min-device --fit-ceiling`, 2 MiB
#     steps), as a ratio to peak allocated, and its gaps: the sizes below it that fail though a
#     smaller one fits ("fails 210-214 MiB; fits 200-208 alone"), "above the ceiling" when the
#     bisection's answer lies above it (not scanned), "-" for none. Cost: every 2 MiB step from the
#     answer to the ceiling is a replay (~2,500 for a 50 GiB trace at 1.10); FIT_CEILING=none is the
#     bisection alone (no gaps column), FIT_MIN_DEVICE=0 skips both;
#   - on the 80 GiB device: the driver's memory calls, their H100 driver time (each call weighted
#     by its H100 median: the figures of cudaemu's CUDAEMU_LATENCY=h100 preset, docs/benchmarks.md
#     section 4) and the stream synchronizations; and the memory calls of the run at the 1 % cap.
# Then one summary line per configuration, with the totals over the six traces of
# FIT_TRACES' pytorch/ folder (issue 33's goal: no more memory calls than the default's, no more
# H100 driver time than classic's, at most 4 synchronizations).
#   benchmarks/fit_table.sh [BUILD_DIR]                                (default build)
#   FIT_TRACES=DIR[:DIR...]  folders of PyTorch snapshots (*.pickle, converted here with
#                         tools/snapshot2trace.py, a row per device with data) or traces
#                         (*.trace); without it only the bundled workloads run. The recordings of
#                         the docs are third-party data, never copied into the repository (their
#                         sources: the README.md beside them).
#   FIT_MODES='name=config;name=config'                                (other configurations)
# Replays run on cudaemu, whose placements repeat exactly; needs /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
replay="$build/tools/xseg-replay"
[ -x "$replay" ] || { echo "fit_table.sh: $replay not built (ninja -C $build)" >&2; exit 1; }
modes=${FIT_MODES:-"default=expandable_segments:True;classic=expandable_segments:False;PyTorch's expandable layout=expandable_segments:True,expandable_segments_recycle:False;defrag opt-in=expandable_segments:True,expandable_segments_defrag:True"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

specs=() groups=()
if [ -n "${FIT_TRACES:-}" ]; then
  IFS=':' read -r -a dirs <<<"$FIT_TRACES"
  for dir in "${dirs[@]}"; do
    [ -d "$dir" ] || { echo "fit_table.sh: FIT_TRACES entry $dir is not a folder" >&2; exit 1; }
    group=$(basename "$dir")
    for f in "$dir"/*.pickle "$dir"/*.trace; do
      [ -e "$f" ] || continue
      case $f in
        *.pickle)
          # every device that holds data: NAME.trace, or NAME-devN.trace when there are several
          b=$(basename "$f" .pickle); b=${b#memory_}
          mkdir "$tmp/$b.d"
          /usr/bin/python3 tools/snapshot2trace.py --out-dir "$tmp/$b.d" "$f" > "$tmp/$b.list"
          n=$(wc -l < "$tmp/$b.list")
          while IFS=$'\t' read -r dev path _; do
            t="$tmp/$b.trace"; [ "$n" -gt 1 ] && t="$tmp/$b-dev$dev.trace"
            mv "$path" "$t"; specs+=("$t"); groups+=("$group")
          done < "$tmp/$b.list" ;;
        *) specs+=("$f"); groups+=("$group") ;;
      esac
    done
  done
  [ ${#specs[@]} -gt 0 ] || echo "fit_table.sh: no *.pickle or *.trace with allocations in $FIT_TRACES" >&2
fi
specs+=(builtin:training builtin:inference); groups+=(builtin builtin)

field() { /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])[sys.argv[1]])' "$1"; }

IFS=';' read -r -a cols <<<"$modes"
for col in "${cols[@]}"; do
  name=${col%%=*}; cfg=${col#*=}
  : > "$tmp/out"
  for i in "${!specs[@]}"; do
    spec=${specs[$i]}
    run=$("$replay" --summary=json --marks=none --config "$cfg" "$spec" 2>/dev/null | tail -n 1)
    peak=$(field peak_allocated_bytes <<<"$run")
    cap=$(( (peak * 101 / 100 + 2097151) / 2097152 * 2097152 ))
    [ "$cap" -gt 0 ] || cap=2097152
    atcap=$("$replay" --summary=json --marks=none --device-mem "$cap" --config "$cfg" "$spec" 2>/dev/null | tail -n 1)
    fit='{}'
    if [ "${FIT_MIN_DEVICE:-1}" != 0 ]; then
      fit=$("$replay" --min-device --fit-ceiling "${FIT_CEILING:-1.10}" --summary=json --config "$cfg" "$spec" \
              2>/dev/null | tail -n 1) || fit='{}'
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "${groups[$i]}" "$spec" "$run" "$atcap" "$fit" >> "$tmp/out"
  done
  /usr/bin/python3 - "$name" "$cfg" "$tmp/out" <<'PY'
import json, os, sys
name, cfg, out = sys.argv[1], sys.argv[2], sys.argv[3]
# H100 medians in microseconds (docs/benchmarks.md, "VMM call costs"; cudaemu's CUDAEMU_LATENCY=h100)
us = {"cuMemCreate": 8.6, "cuMemMap": 0.7, "cuMemSetAccess": 21.9, "cuMemUnmap": 15.5,
      "cuMemRelease": 20.4, "cuMemAlloc": 39.0, "cuMemFree": 42.8}
print(f"\n{name} (`{cfg}`)\n")
print("| workload | peak allocated (MiB) | failed allocations at 1.01 × peak | smallest device / peak "
      "(--min-device) | gaps up to the ceiling | driver memory calls (80 GiB) | H100 driver time (ms) | "
      "synchronizations | memory calls at 1.01 × peak |")
print("|---|---|---|---|---|---|---|---|---|")


def mib_ranges(rs):
    return ", ".join(f"{lo >> 20}" if lo == hi else f"{lo >> 20}–{hi >> 20}" for lo, hi in rs)


def gaps_of(fit):
    """The gaps column: the failing sizes below the answer and the smaller ones that fit alone."""
    if fit.get("above_ceiling"):
        return "above the ceiling"
    if "gaps" not in fit or not fit.get("ceiling"):
        return "—"
    if not fit["gaps"]:
        return "none"
    return f"fails {mib_ranges(fit['gaps'])} MiB; fits {mib_ranges(fit['also_fits'])} alone"
six = [0, 0.0, 0, 0]
fits = worst = n = 0
for line in open(out):
    group, spec, run, atcap, fit = line.rstrip("\n").split("\t")
    label = os.path.basename(spec).removesuffix(".trace")
    try:
        run, atcap = json.loads(run), json.loads(atcap)
    except ValueError:
        print(f"| {label} | failed to replay | | | | | | | |")
        continue
    try:
        fit = json.loads(fit)
        ratio, gaps = f"{fit['ratio']:.4f}", gaps_of(fit)
    except (ValueError, KeyError):
        ratio = gaps = "—"
    calls = run["driver_calls"]
    ms = sum(us.get(k, 0) * v for k, v in calls.items()) / 1000
    syncs = calls.get("cuStreamSynchronize", 0)
    failed = atcap["failed_allocs"]
    n += 1
    fits += failed == 0
    worst = max(worst, failed)
    if group == "pytorch":
        six = [six[0] + run["driver_memory_calls"], six[1] + ms, six[2] + syncs, six[3] + 1]
    print(f"| {label} | {run['peak_allocated_bytes'] / 2**20:,.1f} | {failed} | {ratio} | {gaps} | "
          f"{run['driver_memory_calls']:,} | {ms:.1f} | {syncs} | {atcap['driver_memory_calls']:,} |")
print(f"\n{name}: {fits} of {n} workloads with no failed allocation at 1.01 × peak allocated "
      f"(most failures: {worst})" +
      (f"; the {six[3]} pytorch/ traces on 80 GiB: {six[0]:,} memory calls, {six[1]:.0f} ms "
       f"modelled H100 driver time, {six[2]} synchronizations." if six[3] else "."))
PY
done
