#!/usr/bin/env bash
# Check suites: the test suites on the real driver, one test at a time (they share the device
# and compare cuMemGetInfo exactly), most valuable first, each under what is left of the check's
# time; a suite it cannot start is an item "not reached", one it stopped keeps the tests that
# finished. Every test also runs under a limit of its own (test_limit.py, meson's --wrapper: a
# quarter of its meson timeout, 10 to 90 s), so a test that hangs costs seconds and its item says
# it timed out. `meson test --list` is read in both of meson's forms (summary.py list-tests).
# On --resume, a suite that passed before is not run again. --quick: each suite's first test only
# (python's is all of tests/python: skipped). The driver suite is the driver check's; the build
# suite checks the source.
set -uo pipefail
. "$XSEG_GPU_ROOT/benchmarks/gpu/lib.sh"
cd "$XSEG_GPU_ROOT"
W=$XSEG_GPU_WORK
B=$XSEG_GPU_BUILD
SUITES=(alloc services history python group segment replay unit fuzz)
# XSEG_GPU_SUITES: another list (space-separated), e.g. on a call of its own.
[ -n "${XSEG_GPU_SUITES:-}" ] && read -ra SUITES <<< "$XSEG_GPU_SUITES"
# XSEG_GPU_SUITE_TESTS: within a suite, only these tests ("alloc=stale_scenarios,stale_oracle_classic
# replay=replay_cli"), for a resume with less device time than the whole suite needs; the suite's
# item then says which it ran.
declare -A ONLY=()
for kv in ${XSEG_GPU_SUITE_TESTS:-}; do
    ONLY[${kv%%=*}]=${kv#*=}
done
meson test -C "$B" --no-rebuild --list > "$W/list.txt" 2> "$W/list.err"
# A form of --list summary.py does not know would make every suite look empty: say so instead.
if [ -s "$W/list.txt" ] && [ -z "$("$PY" "$GPU_DIR/summary.py" list-tests "$W/list.txt" '*' | head -1)" ]; then
    check "meson test --list" fail "no line in a form summary.py reads (PROJECT:SUITE / TEST or SUITE - PROJECT:TEST): $(head -1 "$W/list.txt")"
fi
for s in "${SUITES[@]}"; do
    tests=$("$PY" "$GPU_DIR/summary.py" list-tests "$W/list.txt" "$s")
    if [ -z "$tests" ]; then
        check "suite $s" skip "this build has no test in suite $s"
        continue
    fi
    if [ -n "${XSEG_GPU_PREVIOUS:-}" ] &&
       [ "$("$PY" "$GPU_DIR/summary.py" item-status "$XSEG_GPU_PREVIOUS" suites "suite $s")" = pass ]; then
        continue   # kept from the previous summary by summary.py write
    fi
    if [ "$XSEG_GPU_QUICK" = 1 ] && [ "$s" = python ]; then
        check "suite $s" skip "--quick: its one test is the whole of tests/python (half a minute of CPU)"
        continue
    fi
    if ! has_time 8; then
        check "suite $s" not-reached "the check's share was spent before it"
        continue
    fi
    args=(--suite "$s")
    [ "$XSEG_GPU_QUICK" = 1 ] && args=("$(echo "$tests" | head -1)")
    only=""
    if [ -n "${ONLY[$s]:-}" ]; then
        IFS=, read -ra args <<< "${ONLY[$s]}"
        only=" (XSEG_GPU_SUITE_TESTS: ${ONLY[$s]})"
    fi
    left=$(time_left)
    meson_tests "$left" "gpu-suite-$s" "$W/suite-$s.log" "$W/testlog-$s.json" "${args[@]}"
    rc=$?
    echo "meson test exited $rc" >> "$W/suite-$s.log"
    [ -s "$W/testlog-$s.json" ] && summarize tests "$W/testlog-$s.json"
    ran=$(grep -c . "$W/testlog-$s.json" 2>/dev/null || echo 0)
    total=$(echo "$tests" | wc -l)
    [ "$XSEG_GPU_QUICK" = 1 ] && total=1
    [ -n "$only" ] && total=${#args[@]}
    if [ $rc = 124 ] || [ $rc = 137 ]; then
        check "suite $s" not-reached "stopped after $left s: $ran of $total tests ran"
    elif [ $rc = 0 ] && [ "$ran" -gt 0 ] &&
         [ "$("$PY" -c 'import json,sys; print(sum(json.loads(l).get("result") != "SKIP" for l in open(sys.argv[1]) if l.strip()))' "$W/testlog-$s.json" 2>/dev/null || echo 1)" = 0 ]; then
        # Every test skipped (the H200's python suite: no pytest): not a pass, so --resume runs it again.
        check "suite $s" skip "all $ran tests skipped: $(grep -m1 -E 'SKIP' "$W/suite-$s.log" | cut -c1-200)"
    elif [ $rc = 0 ]; then
        check "suite $s" pass "$ran of $total tests$([ "$XSEG_GPU_QUICK" = 1 ] && echo " (--quick: the first)")$only"
    else
        check "suite $s" fail "meson test exited $rc$only: $(grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|ERROR)' "$W/suite-$s.log" | head -5)"
    fi
done

exit 0
