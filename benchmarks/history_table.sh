#!/usr/bin/env bash
# The history table of docs/benchmarks-host.md: cached 512 B pairs made 24 calls deep, history
# off and in each setting; instructions per pair (benchmarks/callgrind_history.sh, exact) and ns
# per pair (bench_history, median of REPS), each with its extra over history off: the cost of
# recording one allocation. A setting that turns history on also takes the pair off the stream
# slots (the permit), so the extra includes the device lock's path.
#   benchmarks/history_table.sh [BUILD_DIR]       (default build; needs valgrind)
#   PAIRS=100000 REPS=9                           (bench_history's settings)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench="$build/benchmarks/bench_history"
[ -x "$bench" ] || { echo "history_table.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
benchmarks/callgrind_history.sh "$build" > "$tmp/ir"
"$bench" --pairs "${PAIRS:-100000}" --reps "${REPS:-9}" 2>/dev/null > "$tmp/ns"
/usr/bin/python3 - "$tmp/ir" "$tmp/ns" <<'PY'
import re, sys
ir = {}
for line in open(sys.argv[1]).read().splitlines()[1:]:
    m = re.match(r"^(.*\S)\s+(\d+)$", line)
    if m:
        ir[m[1]] = int(m[2])
ns, clock = {}, ""
for line in open(sys.argv[2]):
    m = re.match(r"^(.*\S)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line)
    if m and not line.startswith("#"):
        ns[m[1]] = float(m[2])
    if line.startswith("# this machine:"):
        clock = line[len("# this machine:"):].strip()
if "off" not in ir or "off" not in ns:
    sys.exit("history_table.sh: no 'off' row in the outputs")
print("| setting | instructions per pair | over off | ns per pair (median) | over off |")
print("|---|---:|---:|---:|---:|")
for name, i in ir.items():
    t = ns.get(name)
    extra = lambda a, b: "—" if name == "off" else "+{:,.0f}".format(a - b)
    print("| %s | {:,} | %s | %s | %s |".format(i) % (
        name, extra(i, ir["off"]), "n/a" if t is None else "%.1f" % t,
        "n/a" if t is None else extra(t, ns["off"])))
if clock:
    print("\nOn this machine: " + clock + ".")
PY
