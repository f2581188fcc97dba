#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the build tools it lacks (Debian packages),
# builds, and runs every meson test suite three times — plain, under AddressSanitizer +
# UndefinedBehaviorSanitizer, and under ThreadSanitizer; then fuzzes each parser for 10 s
# ($XSEG_FUZZ_SECONDS; tools/fuzz.sh). Exits non-zero if any test fails.
#   tools/test.sh            everything
#   tools/test.sh --quick    the plain build only
#   tools/test.sh --cpu-times   also each test's CPU time against its limit (tests/build/cpu_times.py:
#                               a table per setup, in DIR/meson-logs/cpu-times*.md; a limit below 3x
#                               the CPU time fails the run)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0; cpu_times=0
for a in "$@"; do
  case $a in
    --quick) quick=1 ;;
    --cpu-times) cpu_times=1 ;;
    *) echo "usage: tools/test.sh [--quick] [--cpu-times]" >&2; exit 2 ;;
  esac
done

. tools/ensure-build-tools.sh
ensure_build_tools test.sh --tests

# build dir, extra meson options, test setup
configs=("build||")
if [ $quick = 0 ]; then
  # The sanitizer builds also run xseg's own checks (base/assert.h) at the expensive level: the
  # device lock's owner asserted wherever it must be held, and dev_check walking every device
  # state after each operation. Under TSan the walks cost about nothing next to TSan's own
  # instrumentation (the suite's CPU time is the same as at debug_level=1 on a 2-core machine).
  configs+=("build-asan|-Db_sanitize=address,undefined -Db_lundef=false -Dbenchmarks=false -Ddebug_level=2|sanitize")
  configs+=("build-tsan|-Db_sanitize=thread -Db_lundef=false -Dbenchmarks=false -Ddebug_level=2|tsan")
fi

total_pass=0; total_fail=0; total_skip=0; rc=0
for c in "${configs[@]}"; do
  IFS='|' read -r dir opts setup <<<"$c"
  echo "=== building in $dir${opts:+ ($opts)}: minutes the first time, longer for the sanitizer builds"
  if [ ! -f "$dir/build.ninja" ]; then
    # shellcheck disable=SC2086
    meson setup "$dir" $opts -Dtests=enabled >/dev/null
  else
    # A build dir made by tools/replay.sh before cmocka was installed has the tests off, and one
    # made by an older copy of this script may have other options: apply this script's.
    # A build dir from before -Dtests became a feature cannot take the new value: set it up anew.
    # shellcheck disable=SC2086
    meson configure "$dir" $opts -Dtests=enabled >/dev/null 2>&1 ||
      meson setup --wipe "$dir" $opts -Dtests=enabled >/dev/null
  fi
  ninja -C "$dir" >/dev/null
  echo "=== meson test in $dir${setup:+ (setup $setup)}"
  args=(-C "$dir" --print-errorlogs --num-processes 2)
  [ -n "$setup" ] && args+=(--setup "$setup")
  if [ $cpu_times = 1 ]; then
    # The same run with each test wrapped (its CPU time recorded) at the limits themselves.
    if ! python3 tests/build/cpu_times.py "$dir" ${setup:+--setup "$setup"} --measure-multiplier 1 \
        --markdown "$dir/meson-logs/cpu-times${setup:+-$setup}.md"; then rc=1; fi
  elif ! meson test "${args[@]}"; then rc=1; fi
  log="$dir/meson-logs/testlog${setup:+-$setup}.json"
  if [ -f "$log" ]; then
    read -r p f s < <(python3 - "$log" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else: f += 1
print(p, f, s)
PY
)
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
  fi
done
echo "tests: ${total_pass} passed, ${total_fail} failed, ${total_skip} skipped"
# A short fuzzing run of every parser (libFuzzer with clang when present; tools/fuzz.sh).
if [ $quick = 0 ]; then
  echo "=== fuzzing each parser for ${XSEG_FUZZ_SECONDS:-10} s (tools/fuzz.sh; it builds build-fuzz first)"
  if ! tools/fuzz.sh "${XSEG_FUZZ_SECONDS:-10}"; then
    echo "fuzzing: FAILED (tools/fuzz.sh; the inputs are in build-fuzz/crashes/)"
    rc=1
  fi
fi
exit $rc
