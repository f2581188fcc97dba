#!/usr/bin/env bash
# The GPU acceptance run's dry run on cudaemu, so that benchmarks/gpu/ cannot rot without a GPU,
# and the proof of its budget logic:
#  1. run.sh --emulator --quick --budget 90, the torch check made to sleep past the budget (the
#     test-only hook XSEG_GPU_TEST_SLEEP) with the whole budget as its share: the checks before it
#     pass, it fails at its limit, every check after it is "not reached", the run exits 1, and
#     $OUT holds at most four files (summary.json, logs.tgz, snapshot.pickle, stale_snapshot.pickle);
#  2. --resume of that run: only the failed and not reached checks run (and the build), the
#     driver check is kept from the first summary, everything passes on cudaemu (what needs
#     PyTorch or a kernel skips with the reason), the probes answer;
#  3. refusals: a folder that is no build (the other checks "not reached: the build failed"),
#     bad arguments;
#  4. tables.py and tables.py --features on the dry run (labelled as emulator figures) and on a
#     fabricated GPU summary (the dry run's format, a GPU's figures);
#  5. the suites check's reading of `meson test --list` in both of meson's forms (before 1.12
#     `PROJECT:SUITE / TEST`, from 1.12 `SUITE - PROJECT:TEST`: the first H200 run found no test
#     with the old reader), and its per-test limit: a --resume of the suites check alone with one
#     test made to hang (test-only hooks XSEG_GPU_TEST_HANG, XSEG_GPU_TEST_LIMIT) stops that
#     test after 2 s, its item says it timed out, and the suite after it still runs; a summary
#     whose check says pass with a failed item is printed FAIL.
# Wall time is mostly the sleep of step 1 (~90 s); CPU time is ~25 s. The budget leaves the driver
# check (its eleven tests each through test_limit.py) room to pass under a loaded machine's load.
# usage: gpu_dry_run.sh SOURCE_ROOT BUILD_ROOT
set -uo pipefail
src=$1 build=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu-dry-run: FAIL: $*"; exit 1; }
run=$src/benchmarks/gpu/run.sh

# 1. The cut-off: budget 90 s; driver and torch may take all of it; torch sleeps past it.
XSEG_GPU_TEST_SLEEP=torch=1000 OUT=$tmp/a "$run" --emulator --quick --build "$build" --budget 90 \
    --share driver=1 --share torch=1 > "$tmp/a.log" 2>&1
rc=$?
cat "$tmp/a.log"
[ $rc = 1 ] || fail "the run cut off by its budget exited $rc, not 1 (a check failed)"
[ "$(ls "$tmp/a" | wc -l)" -le 4 ] || fail "more than four files in OUT: $(ls "$tmp/a")"
[ -s "$tmp/a/summary.json" ] && [ -s "$tmp/a/logs.tgz" ] || fail "no summary.json / logs.tgz: $(ls "$tmp/a")"
case " $(tar -tzf "$tmp/a/logs.tgz" | tr '\n' ' ')" in *" ./env.txt "*" ./torch/check.log "*|*" ./torch/check.log "*" ./env.txt "*) ;;
    *) fail "logs.tgz lacks env.txt or torch/check.log: $(tar -tzf "$tmp/a/logs.tgz" | head -20)" ;; esac
python3 - "$tmp/a/summary.json" <<'PYEOF' || exit 1
import json, sys
s = json.load(open(sys.argv[1]))
def fail(msg):
    print("gpu-dry-run: FAIL:", msg); sys.exit(1)
for k in ("device", "driver", "torch", "commit", "date", "budget", "checks", "counts"):
    if k not in s:
        fail("summary.json has no %r" % k)
if not (s["emulator"] and s["quick"] and s["device"].startswith("cudaemu") and s["budget"] == 90):
    fail("summary: %r" % {k: s[k] for k in ("emulator", "quick", "device", "budget")})
got = [(c["name"], c["status"]) for c in s["checks"]]
want = [("build", "pass"), ("driver", "pass"), ("torch", "fail"), ("suites", "not-reached"),
        ("services", "not-reached"), ("probes", "not-reached"), ("frag", "not-reached")]
if got != want:
    fail("checks after the cut-off: %r, not %r" % (got, want))
c = {c["name"]: c for c in s["checks"]}
if "stopped at its limit" not in c["torch"]["reason"] or c["torch"]["limit"] > 90:
    fail("torch: %r" % {k: c["torch"][k] for k in ("reason", "limit")})
if "budget of 90 s was spent" not in c["frag"]["reason"]:
    fail("frag: %r" % c["frag"]["reason"])
rows = [i for i in c["driver"]["items"] if i["name"].startswith("row misuse:")]
if len(rows) < 10 or any(i["status"] == "fail" for i in rows):
    fail("driver: %d misuse conformance rows as items" % len(rows))
if not any(i["name"] == "test driver/driver-vmm" and i["status"] == "pass" for i in c["driver"]["items"]):
    fail("driver: no passing driver/driver-vmm test")
PYEOF

# 2. --resume: the failed and not reached checks, with the whole default budget.
OUT=$tmp/b "$run" --emulator --quick --build "$build" --resume "$tmp/a" > "$tmp/b.log" 2>&1
rc=$?
cat "$tmp/b.log"
[ $rc = 0 ] || fail "run.sh --resume exited $rc"
grep -q "checks: build torch suites services probes frag " "$tmp/b.log" || fail "--resume ran other checks than those left"
[ "$(ls "$tmp/b" | wc -l)" -le 4 ] || fail "more than four files in OUT: $(ls "$tmp/b")"
[ -s "$tmp/b/snapshot.pickle" ] || fail "no snapshot.pickle after --resume"
[ -s "$tmp/b/stale_snapshot.pickle" ] || fail "no stale_snapshot.pickle after --resume"
python3 - "$tmp/b/summary.json" <<'PYEOF' || exit 1
import json, sys
s = json.load(open(sys.argv[1]))
def fail(msg):
    print("gpu-dry-run: FAIL:", msg); sys.exit(1)
c = {c["name"]: c for c in s["checks"]}
if [x["name"] for x in s["checks"]] != ["build", "driver", "torch", "suites", "services", "probes", "frag"]:
    fail("checks: %r" % [x["name"] for x in s["checks"]])
if not c["driver"].get("previous") or c["driver"]["status"] != "pass" or c["torch"].get("previous"):
    fail("the driver check should be the first run's, the torch check this one's")
if not s["resumed_from"] or s["counts"]["fail"] or s["counts"]["not-reached"]:
    fail("after --resume: %r, %r" % (s["resumed_from"], s["counts"]))
items = {i["name"]: i for x in s["checks"] for i in x["items"]}
def item(name, status, word=""):
    i = items.get(name)
    if not i or i["status"] != status or word not in i["reason"]:
        fail("item %r should be %s (%r): %r" % (name, status, word, i))
item("torch.multiprocessing", "skip", "emulator")
item("torch.cuda.MemPool(allocator=CUDAPluggableAllocator)", "skip", "emulator")
item("torch.distributed._symmetric_memory pool", "skip", "emulator")
item("xseg.compat: tms_cuda_graph", "skip", "emulator")  # compat_torch_script.py's cases, listed
item("xseg.compat: vllm_cudagraph", "skip", "emulator")
item("xseg.dump_snapshot (no torch)", "pass")
item("debug_stale_access snapshot (stale_snapshot.pickle)", "pass")
item("suite alloc", "pass")
item("ipc between two processes (test_ipc main)", "pass")
item("one physical handle mapped at many addresses", "pass", "supported")
item("host-located VMM memory read and written by a kernel", "skip", "cudaemu runs no kernels")
item("dma-buf export (cuMemGetHandleForAddressRange)", "pass", "returned CUDA_ERROR_NOT_SUPPORTED")  # cudaemu answers as a device without dma-buf
if not any(n.startswith("xseg-replay --compare") and i["status"] == "pass" for n, i in items.items()):
    fail("frag: no replay on cudaemu")
d = c["services"]["data"]
if not d.get("vmm_costs") or not d.get("remap") or not d.get("device"):
    fail("services: missing VMM costs, remap or device facts: %s" % sorted(d))
PYEOF

# 3. A failed build: the rest is not reached, the run fails; bad arguments are refused.
mkdir -p "$tmp/notabuild"
OUT=$tmp/bad "$run" --emulator --quick --build "$tmp/notabuild" > "$tmp/bad.log" 2>&1 &&
    fail "run.sh passed on a folder that is no build"
grep -q "FAIL .*build" "$tmp/bad.log" && grep -q "NOT-REACHED frag .*the build failed" "$tmp/bad.log" ||
    fail "the failed build is not reported as such: $(cat "$tmp/bad.log")"
mkdir -p "$tmp/bogus" && echo '{"checks": 1}' > "$tmp/bogus/summary.json"
for args in "--budget 5" "--budget x" "--share nosuch=0.5" "--share torch=2" "--resume $tmp/nothing" \
            "--resume $tmp/bogus" "--stage 1"; do
    "$run" $args > /dev/null 2>&1; [ $? = 2 ] || fail "run.sh $args was not refused"
done

# 4. tables.py: the dry run's own summary is labelled as emulator figures ...
python3 "$src/benchmarks/gpu/tables.py" "$tmp/b" > "$tmp/dry.md" || fail "tables.py on the dry run failed"
grep -q '^### GPU acceptance run: cudaemu, emulator dry run: not GPU figures' "$tmp/dry.md" ||
    fail "emulator heading: $(grep '^###' "$tmp/dry.md")"
grep -qF '| one physical handle mapped at many addresses | supported |' "$tmp/dry.md" || fail "no probe table"
python3 "$src/benchmarks/gpu/tables.py" --features "$tmp/b" > "$tmp/dry-features.md" || fail "tables.py --features failed"
grep -qF '| sleep and wake' "$tmp/dry-features.md" && ! grep -q 'yes, NVIDIA' "$tmp/dry-features.md" &&
    grep -qF 'cudaemu dry run, not a GPU' "$tmp/dry-features.md" || fail "features of a dry run: $(cat "$tmp/dry-features.md")"
# ... and a fabricated GPU run (the dry run's format with a GPU's figures) gives the GPU tables.
python3 - "$tmp/b/summary.json" "$tmp/gpu.json" <<'PYEOF' || exit 1
import json, sys
s = json.load(open(sys.argv[1]))
G = 1 << 30
s.update(emulator=False, quick=False, device="NVIDIA H100 80GB HBM3 (fabricated)", driver="580.159.04, CUDA 13.0",
         torch="2.11.0+cu130")
c = {x["name"]: x for x in s["checks"]}
c["frag"]["data"]["training"] = [{"mode": "xseg", "peak_allocated": int(18.673 * G), "peak_reserved": int(19.156 * G),
                                  "utilization": 0.975, "step_ms_median": 243.8, "pair_ns": 2519.0,
                                  "num_sync_all_streams": 0, "steps": 20}]
for r in c["frag"]["data"]["fragmentation"]:
    r["min_fraction"], r["min_fraction_bytes"] = 0.25, 20 * G
cyc = {"sleep_s": 0.25, "wake_s": 0.5, "first_kernel_s": 0.01, "sleep_gib_s": 16.0, "wake_gib_s": 8.0,
       "sleep_x_pinned": 0.4, "wake_x_pinned": 0.2}
c["services"]["data"]["services"] = {"sleep and wake": {"pinned_dtoh_gib_s": 40.0, "pinned_htod_gib_s": 40.0,
    "offload": {"gib": 4, "released_bytes": 4 * G, "first": cyc, "kept": cyc}}}
for i in c["services"]["items"]:
    if i["name"] == "sleep and wake":
        i.update(status="pass", reason="")
name = "dma-buf export (cuMemGetHandleForAddressRange)"
for i in c["probes"]["items"]:
    if i["name"] == name:
        i.update(status="pass", reason="not supported: VMM mapping: cuMemGetHandleForAddressRange returned "
                 "CUDA_ERROR_NOT_SUPPORTED (operation not supported)")
c["probes"]["data"]["probes"][name] = {"supported": False, "words": "VMM mapping: cuMemGetHandleForAddressRange "
                                       "returned CUDA_ERROR_NOT_SUPPORTED (operation not supported)"}
json.dump(s, open(sys.argv[2], "w"))
PYEOF
python3 "$src/benchmarks/gpu/tables.py" "$tmp/gpu.json" > "$tmp/gpu.md" || fail "tables.py on the fabricated run failed"
python3 "$src/benchmarks/gpu/tables.py" --features "$tmp/gpu.json" > "$tmp/gpu-features.md" || fail "--features failed"
cat "$tmp/gpu-features.md"
for want in '### GPU acceptance run: NVIDIA H100 80GB HBM3 (fabricated), driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130' \
            '| xseg | 18.673 GiB | 19.156 GiB | 0.975 | 243.8 ms | 2519 | 0 |' \
            '| 0.2500 (20.000 GiB) |' '| offload, later cycle | 4 | 250.0 ms | 500.0 ms | 10.0 ms | 16.0 (0.40x) | 8.0 (0.20x) |' \
            '| page | cuMemCreate | cuMemMap |' \
            '| dma-buf export (cuMemGetHandleForAddressRange) | not supported | VMM mapping: cuMemGetHandleForAddressRange returned CUDA_ERROR_NOT_SUPPORTED'; do
    grep -qF -- "$want" "$tmp/gpu.md" || fail "tables.py output lacks: $want"
done
grep -q '^###.*emulator' "$tmp/gpu.md" && fail "a GPU run's headings say emulator"
grep -qF '| sleep and wake (offload, discard, a graph'"'"'s pool, by tag) | skipped (NVIDIA H100 80GB HBM3 (fabricated), ' "$tmp/gpu-features.md" ||
    fail "--features: sleep and wake should be skipped (its graph item skipped)"
grep -qF '| dma-buf export (`cuMemGetHandleForAddressRange`) | not supported: VMM mapping: cuMemGetHandleForAddressRange returned CUDA_ERROR_NOT_SUPPORTED' "$tmp/gpu-features.md" ||
    fail "--features: the dma-buf probe's answer"

# 5. Both forms of `meson test --list`: this meson's, and the other one made from it.
meson test -C "$build" --no-rebuild --list > "$tmp/list.txt" 2> /dev/null || fail "meson test --list failed"
python3 - "$tmp/list.txt" "$tmp/list-old.txt" "$tmp/list-new.txt" <<'PYEOF' || exit 1
import re, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1]) if l.strip()]
old, new = [], []
for l in lines:
    m = re.match(r"^(\S+):(\S+) / (.+)$", l) or None
    n = re.match(r"^(\S+) - (\S+?):(.+)$", l) or None
    if m:
        proj, suites, test = m.groups()
    elif n:
        suites, proj, test = n.groups()
    else:
        print("gpu-dry-run: FAIL: a --list line in neither form:", l); sys.exit(1)
    old.append("%s:%s / %s" % (proj, suites, test))
    new.append("%s - %s:%s" % (suites, proj, test))
old.append("xseg:alloc+extra / two_suites_test")  # a test of two suites
new.append("alloc+extra - xseg:two_suites_test")
open(sys.argv[2], "w").write("\n".join(old) + "\n")
open(sys.argv[3], "w").write("\n".join(new) + "\n")
PYEOF
for suite in alloc services driver extra; do
    a=$(python3 "$src/benchmarks/gpu/summary.py" list-tests "$tmp/list-old.txt" $suite)
    b=$(python3 "$src/benchmarks/gpu/summary.py" list-tests "$tmp/list-new.txt" $suite)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "--list forms read differently for suite $suite: $(echo "$a" | head -3) / $(echo "$b" | head -3)"
    # A here-string, not `echo | grep -q`: bash's echo writes a list over 4 KiB in two writes
    # (alloc's is 4.3 KiB, ipc_roundtrip in the first), grep -q may exit on the match between
    # them, and under pipefail echo's SIGPIPE fails the pipeline: once, in a loaded fresh-check.
    case $suite in alloc) grep -qx ipc_roundtrip <<< "$a" || fail "suite alloc lacks ipc_roundtrip: $(head -3 <<< "$a")" ;;
                   extra) [ "$a" = two_suites_test ] || fail "a test of two suites: '$a'" ;; esac
done
echo "gpu-dry-run: --list read in both forms ($(wc -l < "$tmp/list-old.txt") lines)"

# ... and the per-test limit: the first test of alloc hangs; it alone is stopped, after 2 s.
hang=$(python3 "$src/benchmarks/gpu/summary.py" list-tests "$tmp/list.txt" alloc | head -1)
python3 - "$tmp/b/summary.json" "$tmp/prev/summary.json" <<'PYEOF' || exit 1
import json, os, sys
s = json.load(open(sys.argv[1]))
for c in s["checks"]:
    if c["name"] == "suites":
        c.update(status="fail", items=[])
    elif c["name"] == "driver":  # a check kept from a summary that says pass with a failed item
        c["items"].append({"name": "row misuse: fabricated", "status": "fail", "reason": "fabricated"})
os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
json.dump(s, open(sys.argv[2], "w"))
PYEOF
XSEG_GPU_SUITES="alloc unit" XSEG_GPU_TEST_HANG=$hang XSEG_GPU_TEST_LIMIT=2 OUT=$tmp/c \
    "$run" --emulator --quick --build "$build" --resume "$tmp/prev" > "$tmp/c.log" 2>&1
rc=$?
cat "$tmp/c.log"
[ $rc = 1 ] || fail "the run with a hanging test exited $rc, not 1"
grep -q "checks: build driver suites " "$tmp/c.log" || fail "--resume did not rerun the driver check (its failed item) and suites"
python3 - "$tmp/c/summary.json" "$hang" <<'PYEOF' || exit 1
import json, sys
s, hang = json.load(open(sys.argv[1])), sys.argv[2]
def fail(msg):
    print("gpu-dry-run: FAIL:", msg); sys.exit(1)
c = {x["name"]: x for x in s["checks"]}
items = {i["name"]: i for i in c["suites"]["items"]}
i = items.get("test alloc/" + hang)
if not i or i["status"] != "fail" or not i["reason"].startswith("TIMEOUT: timed out after 2 s"):
    fail("the hanging test's item: %r" % i)
if c["suites"]["seconds"] > 40:
    fail("the suites check took %s s with a test stopped after 2 s" % c["suites"]["seconds"])
if items.get("suite unit", {}).get("status") != "pass":
    fail("the suite after the hang: %r" % items.get("suite unit"))
PYEOF
echo "gpu-dry-run: ok"
