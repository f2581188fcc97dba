#!/usr/bin/env bash
# Check services: services and driver costs, most valuable first. torch_checks.py --group
# services (sleep/wake of live tensors in GiB/s beside the pinned copy rate of the same call and
# the time until a kernel runs again, a CUDA graph replayed bit-exact after a tagged sleep and
# wake, trim), test_ipc between two processes (and its fabric and peer cases where the device has
# them), bench_vmm_costs (create, map, set access, unmap, release per size), device_probe.py (the
# remap of a kept handle; devices, fabric support, the peer matrix), bench_services (the link's
# pinned and pageable copy rates and pinning costs, sleep/wake GiB/s beside the pinned copy and
# driver calls through the C API, trim, the release threshold), and whether sleep and wake ran at
# 0.8x of that pinned copy or better. A step with no time left is an item "not reached".
set -uo pipefail
. "$XSEG_GPU_ROOT/benchmarks/gpu/lib.sh"
cd "$XSEG_GPU_ROOT"
W=$XSEG_GPU_WORK
B=$XSEG_GPU_BUILD
q=$XSEG_GPU_QUICK

# What the device is: count, fabric handles, peer access.
if "$PY" "$GPU_DIR/device_probe.py" info > "$W/device.json" 2> "$W/device.err"; then
    data device "$W/device.json"
    fabric=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("yes" if d["devices"] and d["devices"][0]["fabric"] else "no")' "$W/device.json")
    ndev=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["device_count"])' "$W/device.json")
    check "device facts (device_probe.py info)" pass "$ndev device(s), fabric handles: $fabric"
else
    check "device facts (device_probe.py info)" fail "$(tail -3 "$W/device.err")"
    fabric=no ndev=1
fi

# The services through PyTorch: live tensors asleep and awake, a graph replayed after a wake.
why=$(torch_reason)
if [ -n "$why" ]; then
    for c in "sleep and wake" "graph replayed after a tagged wake" "trim"; do check "$c" skip "$why"; done
else
    quick=(); [ "$q" = 1 ] && quick=(--quick)
    timeout --kill-after=5 "$(time_left $(( $(time_left) / 2 )))" "$PY" "$GPU_DIR/torch_checks.py" --group services --lib "$B/libxseg.so" --out "$W" "${quick[@]}" \
        > "$W/services_checks.log" 2>&1
    summarize lines "$W/services_checks.log" services
fi

# binary NAME CMD...: a cmocka program as one check (exit 77 or only skipped cases: skip).
binary() {
    local name=$1; shift
    has_time 5 || { check "$name" not-reached "the check's share was spent before it"; return; }
    run_logged "$(echo "$name" | tr ' /' '__')" timeout --kill-after=5 "$(time_left)" "$@"
    local rc=$? log="$W/$(echo "$name" | tr ' /' '__').log"
    if [ $rc = 77 ] || { [ $rc = 0 ] && grep -q '\[  PASSED  \] 0 test' "$log"; }; then
        check "$name" skip "$(grep -m1 'SKIPPED \]' "$log" | sed 's/.*SKIPPED \] *//')"
    elif [ $rc = 0 ]; then
        check "$name" pass "$(grep -m1 'PASSED' "$log")"
    else
        check "$name" fail "exit $rc: $(tail -8 "$log")"
    fi
}

# IPC between two real processes (fork + exec, fd passing), through the public API.
binary "ipc between two processes (test_ipc main)" "$B/tests/alloc/test_ipc" main
if [ "$XSEG_GPU_EMULATOR" = 1 ]; then
    CUDAEMU_FABRIC=1 binary "ipc over fabric handles (test_ipc fabric)" "$B/tests/alloc/test_ipc" fabric
    CUDAEMU_DEVICES=2 binary "peer access (test_ipc peer)" "$B/tests/alloc/test_ipc" peer
    CUDAEMU_DEVICES=2 binary "peer access (test_expandable peer)" "$B/tests/alloc/test_expandable" peer
else
    if [ "$fabric" = yes ]; then
        binary "ipc over fabric handles (test_ipc fabric)" "$B/tests/alloc/test_ipc" fabric
    else
        check "ipc over fabric handles (test_ipc fabric)" skip "the device reports no fabric handle support"
    fi
    if [ "$ndev" -ge 2 ]; then
        binary "peer access (test_ipc peer)" "$B/tests/alloc/test_ipc" peer
        binary "peer access (test_expandable peer)" "$B/tests/alloc/test_expandable" peer
    else
        check "peer access" skip "one device ($ndev): peer access needs two"
    fi
fi

# VMM call costs per size, and the remap of a kept handle.
reps=20 max=1024 sizes=2,20,64,512
[ "$q" = 1 ] && reps=3 max=64 sizes=2,64
if ! has_time 5; then
    check "bench_vmm_costs" not-reached "the check's share was spent before it"
elif run_logged vmm_costs timeout --kill-after=5 "$(time_left)" "$B/benchmarks/bench_vmm_costs" --reps $reps --max-size $max --csv "$W/vmm_costs.csv"; then
    "$PY" -c 'import csv,json,sys; json.dump(list(csv.DictReader(open(sys.argv[1]))), open(sys.argv[2], "w"))' \
        "$W/vmm_costs.csv" "$W/vmm_costs.json" && data vmm_costs "$W/vmm_costs.json"
    check "bench_vmm_costs" pass
else
    check "bench_vmm_costs" fail "$(tail -5 "$W/vmm_costs.log")"
fi
if ! has_time 5; then
    check "remap of a kept handle (device_probe.py remap)" not-reached "the check's share was spent before it"
elif timeout --kill-after=5 "$(time_left)" "$PY" "$GPU_DIR/device_probe.py" remap --reps $reps --sizes $sizes \
        > "$W/remap.json" 2> "$W/remap.err"; then
    data remap "$W/remap.json"
    check "remap of a kept handle (device_probe.py remap)" pass
else
    check "remap of a kept handle (device_probe.py remap)" fail "$(tail -3 "$W/remap.err")"
fi

# The services through the C API (sleep/wake per GiB, trim, release threshold).
if ! has_time 10; then
    check "bench_services" not-reached "the check's share was spent before it"
elif [ "$XSEG_GPU_EMULATOR" = 1 ] && [ "$q" = 1 ]; then
    check "bench_services" skip "--quick on the emulator: its 1 GiB of host copies takes 15 s on a loaded 2-core VM"
elif run_logged bench_services timeout --kill-after=5 "$(time_left)" "$B/benchmarks/bench_services" --gib $([ "$q" = 1 ] && echo 1 || echo 4) --reps $([ "$q" = 1 ] && echo 1 || echo 3); then
    check "bench_services" pass
    # Its markdown tables as data: [[header cells], [row cells]...] per table.
    "$PY" - "$W/bench_services.log" "$W/bench_services.json" <<'PYEOF'
import json, sys
tables, cur = [], None
for line in open(sys.argv[1]):
    if line.startswith("|"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue
        if cur is None:
            cur = []
            tables.append(cur)
        cur.append(cells)
    else:
        cur = None
json.dump(tables, open(sys.argv[2], "w"))
PYEOF
    data bench_services "$W/bench_services.json"
    # Sleep and wake (offload, the backup kept) against the pinned copy measured in the same call.
    if [ "$XSEG_GPU_EMULATOR" = 1 ]; then
        check "sleep and wake at the link's speed (bench_services)" skip "emulator: wall times are the host's memcpy (the timeline model's ratio is in the log)"
    else
        verdict=$("$PY" - "$W/bench_services.json" <<'PYEOF'
import json, sys
rows = {}
for t in json.load(open(sys.argv[1])):
    if t and t[0][0] == "operation":
        col = t[0].index("x of it")
        rows.update({r[0]: float(r[col]) for r in t[1:] if r[0] in ("sleep (offload)", "wake (offload)")})
bad = [k for k, v in rows.items() if v < 0.8]
print(("fail " if bad or len(rows) < 2 else "pass ") +
      ", ".join("%s %.2fx of the pinned copy" % (k, v) for k, v in sorted(rows.items())))
PYEOF
)
        check "sleep and wake at the link's speed (bench_services)" "${verdict%% *}" "${verdict#* }"
    fi
else
    check "bench_services" fail "$(tail -5 "$W/bench_services.log")"
fi

# Many small blocks (issue 74 item 7): sleep + wake of N runs per size, 4 KiB to 64 MiB, one call
# per run (sleep_copy_batch_kb:0) against cuMemcpyBatchAsync batches (65536), wall time on the
# driver: the figures that replace the table's assumed per-call costs (docs/benchmarks.md
# #many-small-blocks) and settle sleep_copy_batch_kb's default. Data: sleep_batch, per size
# [bytes, runs, one-call us, batched us]. A driver without the call: skip, saying so.
if ! has_time 10; then
    check "many small blocks, batched against one call per run (bench_sleep_batch)" not-reached "the check's share was spent before it"
elif [ "$XSEG_GPU_EMULATOR" = 1 ] && [ "$q" = 1 ]; then
    check "many small blocks, batched against one call per run (bench_sleep_batch)" skip "--quick on the emulator: its 2x256 MiB of host copies per size take minutes on a loaded 2-core VM (benchmarks/sleep_batch_table.sh gives the model's table)"
elif run_logged sleep_batch_one timeout --kill-after=5 "$(( $(time_left) / 2 ))" "$B/benchmarks/bench_sleep_batch" 0 3 &&
     run_logged sleep_batch_bat timeout --kill-after=5 "$(time_left)" "$B/benchmarks/bench_sleep_batch" 65536 3; then
    verdict=$("$PY" - "$W/sleep_batch_one.log" "$W/sleep_batch_bat.log" "$W/sleep_batch.json" <<'PYEOF'
import json, sys
def rows(path):
    return [l.split() for l in open(path) if l.startswith("size ")]
one, bat = rows(sys.argv[1]), rows(sys.argv[2])
out = [[int(a[1]), int(a[3]), float(a[7]), float(b[7])] for a, b in zip(one, bat)]
json.dump(out, open(sys.argv[3], "w"))
if any(l.startswith("driver: no ") for l in open(sys.argv[2])):
    print("skip the driver lacks cuMemcpyBatchAsync_v2 (CUDA 13.0's form): both runs copied run by run")
elif not out:
    print("fail no rows")
else:
    print("pass " + ", ".join("%d KiB %.2fx" % (r[0] // 1024, r[3] / r[2]) for r in out if r[2]))
PYEOF
)
    data sleep_batch "$W/sleep_batch.json"
    check "many small blocks, batched against one call per run (bench_sleep_batch)" "${verdict%% *}" "${verdict#* }"
else
    check "many small blocks, batched against one call per run (bench_sleep_batch)" fail "$(tail -5 "$W"/sleep_batch_*.log)"
fi

exit 0
