#!/usr/bin/env bash
# Do a lifetime predictor's imperfect guesses still fit? (issue 33) For each rule of
# benchmarks/lifetime_probe.py, its mask (--write-mask) goes to the replay's oracle
# (XSEG_REPLAY_ORACLE=file:MASK), beside no oracle and the trace's truth (=never):
#   - failed allocations on a device of peak allocated x 1.01 rounded up to 2 MiB (fit_table.sh's
#     bar; peak from the run without oracle), per *fullstep* trace;
#   - driver memory calls and stream synchronizations on 80 GiB, summed over all traces.
#   benchmarks/mask_table.sh [BUILD_DIR] TRACE_DIR...   (each TRACE_DIR: one converted snapshot,
#   tools/snapshot2trace.py --out-dir TRACE_DIR SNAPSHOT, frames kept for stack-live)
# Replays run on cudaemu with expandable_segments:True (fit_table.sh's default column).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
if [ $# -gt 0 ] && [ -x "$1/tools/xseg-replay" ]; then build=$1; shift; fi
replay="$build/tools/xseg-replay"
[ -x "$replay" ] || { echo "mask_table.sh: $replay not built (ninja -C $build)" >&2; exit 1; }
[ $# -gt 0 ] || { echo "mask_table.sh: give the folders of converted traces" >&2; exit 2; }
rules=${MASK_RULES:-"size-live+frees stack-live at-high size-live"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cfg=expandable_segments:True
for dir in "$@"; do
  trace=$(find "$dir" -name '*.trace' | sort | head -n 1)
  [ -n "$trace" ] || { echo "mask_table.sh: $dir: no .trace file" >&2; exit 1; }
  name=$(basename "$dir")
  base=$("$replay" --summary=json --marks=none --config "$cfg" "$trace" 2>/dev/null | tail -n 1)
  peak=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["peak_allocated_bytes"])' <<<"$base")
  cap=$(( (peak * 101 / 100 + 2097151) / 2097152 * 2097152 ))
  for rule in none never $rules; do
    case $rule in
      none) oracle= ;;
      never) oracle=never ;;
      *) python3 benchmarks/lifetime_probe.py --write-mask "$rule" "$tmp/mask" "$dir" >/dev/null
         oracle=file:$tmp/mask ;;
    esac
    big=$(XSEG_REPLAY_ORACLE=$oracle "$replay" --summary=json --marks=none --config "$cfg" "$trace" 2>/dev/null | tail -n 1)
    small='{}'
    case $name in *fullstep*)
      small=$(XSEG_REPLAY_ORACLE=$oracle "$replay" --summary=json --marks=none --device-mem "$cap" --config "$cfg" "$trace" 2>/dev/null | tail -n 1) ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$rule" "$name" "$big" "$small" >> "$tmp/out"
  done
done
/usr/bin/python3 - "$tmp/out" <<'PY'
import collections, json, sys
rows = collections.OrderedDict()
full = []
for line in open(sys.argv[1]):
    rule, name, big, small = line.rstrip("\n").split("\t")
    big, small = json.loads(big), json.loads(small)
    r = rows.setdefault(rule, {"fail": {}, "calls": 0, "syncs": 0, "n": 0})
    if small:
        r["fail"][name] = small["failed_allocs"]
        if name not in full:
            full.append(name)
    r["calls"] += big["driver_memory_calls"]
    r["syncs"] += big["driver_calls"].get("cuStreamSynchronize", 0)
    r["n"] += 1
print("| rule | " + " | ".join(f"failed at 1.01x: {n}" for n in full) +
      " | memory calls, 80 GiB | syncs, 80 GiB |")
print("|---" * (len(full) + 3) + "|")
for rule, r in rows.items():
    print(f"| {rule} | " + " | ".join(str(r['fail'].get(n, '-')) for n in full) +
          f" | {r['calls']:,} | {r['syncs']} |")
print(f"\n80 GiB columns: totals over the {max(r['n'] for r in rows.values())} traces given")
PY
