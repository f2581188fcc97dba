#!/usr/bin/env bash
# The cached-pair table of docs/benchmarks-host.md, in its Markdown form: for xseg (both modes,
# both entry points), glibc malloc and mimalloc at 512 B and 4 MiB, the instructions per pair
# (benchmarks/callgrind_pairs.sh) in BUILD_DIR (debugoptimized) and in RELEASE_BUILD (the
# buildtype users get), and the range of bench_host_path's median ns over RUNS runs (BUILD_DIR);
# then xseg's pair through the device lock (benchmarks/callgrind_round_robin.sh), instructions
# only, in both builds: with OFF_BUILD (the same tree with the lifetime placement compiled out,
# core/device/placement.h) also its figure there and the placement's cost (with RELEASE_OFF_BUILD,
# that tree in the release buildtype, the same in the release column), and the expandable
# large pool's pair once more on an 8 GiB device (CUDAEMU_TOTAL_MEM=8G: under 10 GiB, where rule
# S1 places by class; SMALL_DEVICE=none leaves that row out):
#   meson setup build-off -Dc_args=-DXSEG_PLACEMENT_OFF -Dtests=disabled && ninja -C build-off
#   meson setup build-release --buildtype=release -Dtests=disabled && ninja -C build-release
#   meson setup build-release-off --buildtype=release -Dtests=disabled -Dc_args=-DXSEG_PLACEMENT_OFF
#   benchmarks/host_pair_table.sh [BUILD_DIR [OFF_BUILD [RELEASE_BUILD [RELEASE_OFF_BUILD]]]]
#                        (default build, none, build-release; needs valgrind)
#   PAIRS=200000 REPS=5 RUNS=3                       (bench_host_path's settings, the doc's)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
off=${2:-}
rel=${3:-build-release}
rel_off=${4:-}
[ -x "$rel/benchmarks/bench_round_robin" ] || { echo "host_pair_table.sh: $rel/benchmarks/bench_round_robin not built (ninja -C $rel)" >&2; exit 1; }
bench="$build/benchmarks/bench_host_path"
[ -x "$bench" ] || { echo "host_pair_table.sh: $bench not built (ninja -C $build)" >&2; exit 1; }
pairs=${PAIRS:-200000}; reps=${REPS:-5}; runs=${RUNS:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

benchmarks/callgrind_pairs.sh "$build" "$rel" > "$tmp/ir"
benchmarks/callgrind_round_robin.sh "$build" $off > "$tmp/rr"
benchmarks/callgrind_round_robin.sh "$rel" $rel_off > "$tmp/rr_rel"
small_dev=${SMALL_DEVICE:-8G}
if [ "$small_dev" != none ]; then
  RR_ROWS="expandable:2097152" CUDAEMU_TOTAL_MEM="$small_dev" benchmarks/callgrind_round_robin.sh "$build" $off |
    sed "1!s/^/$small_dev /" > "$tmp/rr_small"
  RR_ROWS="expandable:2097152" CUDAEMU_TOTAL_MEM="$small_dev" benchmarks/callgrind_round_robin.sh "$rel" $rel_off |
    sed "1!s/^/$small_dev /" > "$tmp/rr_small_rel"
else
  : > "$tmp/rr_small"; : > "$tmp/rr_small_rel"
fi
for r in $(seq "$runs"); do
  "$bench" --pairs "$pairs" --reps "$reps" 2>/dev/null | sed 's/^/plain /' >> "$tmp/ns"
  "$bench" --pairs "$pairs" --reps "$reps" --only xseg --api torch 2>/dev/null | sed 's/^/torch /' >> "$tmp/ns"
done
/usr/bin/python3 - "$tmp/ir" "$tmp/ns" "$runs" "$tmp/rr" "$tmp/rr_small" "$tmp/rr_rel" "$tmp/rr_small_rel" <<'PY'
import re, sys
ir_file, ns_file, runs, rr_file, rr_small_file, rr_rel_file, rr_small_rel_file = sys.argv[1:8]
ir = {}  # (allocator, mode, size) -> [debugoptimized, release]
for line in open(ir_file).read().splitlines()[1:]:
    f = line.split()
    if len(f) == 5 and f[2].isdigit():
        ir[(f[0], f[1], f[2])] = f[3:5]
def rel_of(path, key_fields):  # the release rows: the figure [, without the placement, difference]
    out = {}
    for line in open(path).read().splitlines()[1:]:
        f = line.split()
        if len(f) in (key_fields + 1, key_fields + 3):
            r = f"{float(f[key_fields]):,.0f}"
            if len(f) == key_fields + 3:
                r += f" ({float(f[key_fields + 1]):,.0f} without the placement, {f[key_fields + 2].replace('%', ' %')})"
            out[tuple(f[:key_fields])] = r
    return out
rr_rel = rel_of(rr_rel_file, 2)
rr_small_rel = rel_of(rr_small_rel_file, 3)
ns = {}
for line in open(ns_file):
    m = re.match(r"(plain|torch) (xseg (?:torch API )?\((classic|expandable)\)|glibc malloc|mimalloc)\s+(\d+)\s+([\d.]+)\s*$", line)
    if not m:
        continue
    api, name, mode, size, t = m.groups()
    who = ("torch" if api == "torch" else "xseg") if name.startswith("xseg") else name.split()[0]
    ns.setdefault((who, mode or "-", size), []).append(float(t))
label = {"xseg": "xseg, {}", "torch": "xseg torch API, {}", "glibc": "glibc malloc", "mimalloc": "mimalloc"}
sizes = {"512": "512 B", "4194304": "4 MiB"}
print(f"| allocator | size | instructions per pair | in the release build | ns per pair, range of {runs} runs |")
print("|---|---|---|---|---|")
for who, modes in (("xseg", ("classic", "expandable")), ("torch", ("classic", "expandable")),
                   ("glibc", ("-",)), ("mimalloc", ("-",))):
    for mode in modes:
        for size in ("512", "4194304"):
            i, r = (f"{float(v):,.0f}" if re.match(r"^[\d.]+$", v) else v
                    for v in ir.get((who, mode, size), ["n/a", "n/a"]))
            t = ns.get((who, mode, size))
            t = "n/a" if not t else (f"{min(t):.1f}" if min(t) == max(t) else f"{min(t):.1f}–{max(t):.1f}")
            print(f"| {label[who].format(mode)} | {sizes[size]} | {i} | {r} | {t} |")
rr_sizes = {"small": "512 B – 1.5 KiB", "large": "2 – 6 MiB"}
for line in open(rr_file).read().splitlines()[1:]:
    f = line.split()  # mode, pool, instructions per pair [, without the placement, difference]
    if len(f) in (3, 5) and f[1] in rr_sizes:
        i = f"{float(f[2]):,.0f}"
        if len(f) == 5:
            i += f" ({float(f[3]):,.0f} without the placement, {f[4].replace('%', ' %')})"
        r = rr_rel.get((f[0], f[1]), "n/a")
        print(f"| xseg, {f[0]}, through the device lock (round robin) | {rr_sizes[f[1]]} | {i} | {r} | n/a |")
for line in open(rr_small_file).read().splitlines()[1:]:
    f = line.split()  # device, mode, pool, instructions per pair [, without the placement, difference]
    if len(f) in (4, 6) and f[2] in rr_sizes:
        i = f"{float(f[3]):,.0f}"
        if len(f) == 6:
            i += f" ({float(f[4]):,.0f} without the placement, {f[5].replace('%', ' %')})"
        print(f"| xseg, {f[1]}, through the device lock (round robin), {f[0].replace('G', ' GiB')} device "
              f"(rule S1) | {rr_sizes[f[2]]} | {i} | {rr_small_rel.get((f[0], f[1], f[2]), 'n/a')} | n/a |")
PY
