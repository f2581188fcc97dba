#!/usr/bin/env bash
# The GPU acceptance run's dry run on cudaemu, so that benchmarks/gpu/ cannot rot without a GPU:
# run.sh --emulator --quick runs every stage on this build, each writes its summary and raw logs
# (8 files at most: what the device tool brings back), the PyTorch parts skip with their reason,
# --resume skips a complete stage, a failed check fails the run; then tables.py turns a
# fabricated GPU summary (the dry run's format, a GPU's figures) into the tables of
# docs/benchmarks.md, and labels emulator figures as such.
# usage: gpu_dry_run.sh SOURCE_ROOT BUILD_ROOT
set -uo pipefail
src=$1 build=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu-dry-run: FAIL: $*"; exit 1; }
py() { python3 - "$@"; }

OUT=$tmp/out "$src/benchmarks/gpu/run.sh" --emulator --quick --build "$build" > "$tmp/run.log" 2>&1
rc=$?
cat "$tmp/run.log"
[ $rc = 0 ] || fail "run.sh --emulator --quick exited $rc"
n=$(ls "$tmp/out" | wc -l)
[ "$n" -le 8 ] || fail "$n files in OUT (the device tool brings back 8)"
for s in 1 2 3 4; do
    [ -s "$tmp/out/stage$s.json" ] && [ -s "$tmp/out/stage$s.tgz" ] || fail "stage $s wrote no stage$s.json / stage$s.tgz"
    case " $(tar -tzf "$tmp/out/stage$s.tgz" | tr '\n' ' ')" in *" ./env.txt "*) ;; *) fail "stage$s.tgz has no env.txt" ;; esac
done
py "$tmp/out" <<'PYEOF' || exit 1
import json, sys
out = sys.argv[1]
def fail(msg):
    print("gpu-dry-run: FAIL:", msg); sys.exit(1)
S = {n: json.load(open("%s/stage%d.json" % (out, n))) for n in (1, 2, 3, 4)}
for n, s in S.items():
    if not (s["complete"] and s["emulator"] and s["quick"] and s["device"].startswith("cudaemu")):
        fail("stage %d summary: %r" % (n, {k: s[k] for k in ("complete", "emulator", "quick", "device")}))
    if s["counts"]["fail"]:
        fail("stage %d has failed checks" % n)
rows = [c for c in S[1]["checks"] if c["name"].startswith("row misuse:")]
if len(rows) < 10 or any(c["status"] == "fail" for c in rows):
    fail("stage 1: %d misuse conformance rows as checks" % len(rows))
if not any(c["name"] == "test driver/driver-vmm" and c["status"] == "pass" for c in S[1]["checks"]):
    fail("stage 1: no passing driver/driver-vmm test")
torch = [c for c in S[2]["checks"] if c["name"] == "torch.multiprocessing"]
if not torch or torch[0]["status"] != "skip" or "emulator" not in torch[0]["reason"]:
    fail("stage 2: torch.multiprocessing should skip with the emulator as its reason: %r" % torch)
if not any(c["name"].startswith("xseg.dump_snapshot") and c["status"] == "pass" for c in S[2]["checks"]):
    fail("stage 2: xseg's snapshot writer did not run")
if not S[3]["data"].get("fragmentation") or not any(
        c["name"].startswith("xseg-replay --compare") and c["status"] == "pass" for c in S[3]["checks"]):
    fail("stage 3: no replay rows")
if not S[4]["data"].get("vmm_costs") or not S[4]["data"].get("remap") or not S[4]["data"].get("device"):
    fail("stage 4: missing VMM costs, remap or device facts: %s" % sorted(S[4]["data"]))
if not any(c["name"].startswith("ipc between two processes") and c["status"] == "pass" for c in S[4]["checks"]):
    fail("stage 4: IPC between two processes did not pass")
PYEOF

# --resume: a complete stage is not run again.
before=$(stat -c %Y.%s "$tmp/out/stage2.json")
sleep 1
OUT=$tmp/out "$src/benchmarks/gpu/run.sh" --emulator --quick --build "$build" --stage 2 --resume > "$tmp/resume.log" 2>&1 ||
    fail "run.sh --resume exited non-zero: $(cat "$tmp/resume.log")"
grep -q "stage 2 already complete" "$tmp/resume.log" || fail "--resume ran stage 2 again: $(cat "$tmp/resume.log")"
[ "$before" = "$(stat -c %Y.%s "$tmp/out/stage2.json")" ] || fail "--resume rewrote stage2.json"

# A failed check fails the run (a build folder that is not one), and bad arguments are refused.
mkdir -p "$tmp/notabuild"
OUT=$tmp/bad "$src/benchmarks/gpu/run.sh" --emulator --quick --stage 1 --build "$tmp/notabuild" > "$tmp/bad.log" 2>&1 &&
    fail "run.sh passed on a folder that is no build"
grep -q "FAIL build" "$tmp/bad.log" || fail "the failed build check is not reported: $(cat "$tmp/bad.log")"
"$src/benchmarks/gpu/run.sh" --stage 5 > /dev/null 2>&1; [ $? = 2 ] || fail "--stage 5 was not refused"
# A stage stopped by its limit still writes its summary (incomplete, failed) and its logs.
XSEG_GPU_STAGE_LIMIT=1 OUT=$tmp/late "$src/benchmarks/gpu/run.sh" --emulator --quick --stage 4 --build "$build" \
    > "$tmp/late.log" 2>&1 && fail "a stage stopped by its limit passed"
[ -s "$tmp/late/stage4.tgz" ] || fail "no stage4.tgz after the limit"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if not s["complete"] and any(
    c["name"] == "stage time limit" and c["status"] == "fail" for c in s["checks"]) else 1)' "$tmp/late/stage4.json" ||
    fail "the summary after the limit: $(cat "$tmp/late/stage4.json" 2>&1 | head -20)"

# tables.py: the dry run's own summaries are labelled as emulator figures ...
python3 "$src/benchmarks/gpu/tables.py" "$tmp/out" > "$tmp/dry.md" || fail "tables.py on the dry run failed"
[ "$(grep -c 'emulator dry run: not GPU figures' "$tmp/dry.md")" = 4 ] || fail "emulator headings: $(grep '^###' "$tmp/dry.md")"
# ... and a fabricated GPU run (the dry run's format with a GPU's figures) gives the GPU tables.
py "$tmp/out" "$tmp/gpu" <<'PYEOF' || exit 1
import json, os, sys
src, dst = sys.argv[1:]
os.makedirs(dst)
G = 1 << 30
for n in (3, 4):
    s = json.load(open("%s/stage%d.json" % (src, n)))
    s.update(emulator=False, quick=False, device="NVIDIA H100 80GB HBM3, 580.159.04 (fabricated)")
    if n == 3:
        s["data"]["training"] = [{"mode": "xseg", "peak_allocated": int(18.673 * G), "peak_reserved": int(19.156 * G),
                                  "utilization": 0.975, "step_ms_median": 243.8, "pair_ns": 2519.0,
                                  "num_sync_all_streams": 0, "steps": 20}]
        for r in s["data"]["fragmentation"]:
            r["min_fraction"], r["min_fraction_bytes"] = 0.25, 20 * G
    else:
        s["data"]["services"] = {"sleep and wake": {"offload": {"gib": 4, "released_bytes": 4 * G, "sleep_s": 0.25,
                                 "wake_s": 0.5, "resume_s": 0.51, "sleep_gib_s": 16.0, "wake_gib_s": 8.0}}}
    json.dump(s, open("%s/stage%d.json" % (dst, n), "w"))
PYEOF
python3 "$src/benchmarks/gpu/tables.py" "$tmp/gpu" > "$tmp/gpu.md" || fail "tables.py on the fabricated run failed"
cat "$tmp/gpu.md"
for want in '### Stage 3 (frag): NVIDIA H100 80GB HBM3, 580.159.04 (fabricated)' \
            '| xseg | 18.673 GiB | 19.156 GiB | 0.975 | 243.8 ms | 2519 | 0 |' \
            '| 0.2500 (20.000 GiB) |' '| offload | 4 | 250.0 ms | 500.0 ms | 510.0 ms | 16.0 | 8.0 |' \
            '| page | cuMemCreate | cuMemMap |'; do
    grep -qF -- "$want" "$tmp/gpu.md" || fail "tables.py output lacks: $want"
done
grep '^###' "$tmp/gpu.md" | grep -q 'emulator' && fail "a GPU run's headings say emulator"
echo "gpu-dry-run: ok"
