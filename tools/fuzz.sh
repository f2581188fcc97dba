#!/usr/bin/env bash
# Fuzz the parsers that read user input with libFuzzer (clang), under ASan + UBSan: the config
# string, the trace language, the RMM CSV log, IPC handles (flat form and socket receive); then tools/snapshot2trace.py with its Python
# mutation fuzzer. Each target runs SECONDS seconds (default 60) from its seed corpus
# (tests/fuzz/corpus/TARGET; for trace also the bundled seed-003 traces) and its regressions
# (tests/fuzz/regressions/TARGET); what the libFuzzer targets learn accumulates in
# build-fuzz/corpus/TARGET. A crash stops that target, leaves the input in build-fuzz/crashes/
# (build-fuzz-py/ for snapshot2trace), and the script exits 1: copy the input into
# tests/fuzz/regressions/TARGET/ when fixing it, and every test setup replays it from then on.
# Without clang (or its libFuzzer runtime) the four libFuzzer targets are skipped, said at the
# start and in the last line; the exit status stays 0 for them (tools/test.sh installs clang).
#   tools/fuzz.sh              60 s per target
#   tools/fuzz.sh 10           CI's run: tools/test.sh runs $XSEG_FUZZ_SECONDS (default 10) per target
#   tools/fuzz.sh 600          the long run of docs/testing.md
#   tools/fuzz.sh 600 trace    one target (config, trace, rmm_csv, ipc, snapshot2trace)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config trace rmm_csv ipc snapshot2trace)
rc=0

need_c=0
c_targets=()
for t in "${targets[@]}"; do [ "$t" != snapshot2trace ] && need_c=1 && c_targets+=("$t"); done
skipped=""
if [ $need_c = 1 ]; then
  if ! command -v clang >/dev/null; then
    skipped="clang not found; Debian: apt-get install clang"
  elif ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
       clang -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
    skipped="clang cannot link -fsanitize=fuzzer, no libFuzzer runtime; Debian: apt-get install libclang-rt-dev"
  fi
  if [ -n "$skipped" ]; then
    echo "fuzz.sh: SKIPPING libFuzzer targets ${c_targets[*]} ($skipped)"
    need_c=0
  fi
fi
if [ $need_c = 1 ]; then
  if [ ! -f build-fuzz/build.ninja ]; then
    CC=clang CXX=clang++ meson setup build-fuzz -Dfuzzing=true -Dtests=enabled -Dbenchmarks=false \
      -Dpython=disabled -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized >/dev/null
  fi
  exes=()
  for t in "${targets[@]}"; do [ "$t" != snapshot2trace ] && exes+=("tests/fuzz/fuzz_$t"); done
  ninja -C build-fuzz "${exes[@]}" >/dev/null
  mkdir -p build-fuzz/crashes
fi

for t in "${targets[@]}"; do
  if [ "$t" = snapshot2trace ]; then
    echo "=== fuzz snapshot2trace for ${secs}s"
    mkdir -p build-fuzz-py
    /usr/bin/python3 tests/fuzz/fuzz_snapshot2trace.py tools/snapshot2trace.py --seconds "$secs" \
      --corpus tests/fuzz/corpus/snapshot2trace --regressions tests/fuzz/regressions/snapshot2trace \
      --save build-fuzz-py || rc=1
    continue
  fi
  [ $need_c = 1 ] || continue
  case $t in config|trace|rmm_csv|ipc) ;; *) echo "fuzz.sh: unknown target '$t'"; exit 2 ;; esac
  echo "=== fuzz $t for ${secs}s"
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  seeds=(tests/fuzz/corpus/"$t" tests/fuzz/regressions/"$t")
  [ "$t" = trace ] && seeds+=(tools/workloads/seed003)
  # -rss_limit_mb: a parser that needs more than 2 GiB for a small input is a bug too.
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      build-fuzz/tests/fuzz/fuzz_"$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -artifact_prefix=build-fuzz/crashes/"$t"- -print_final_stats=1 \
      "$work" "${seeds[@]}" >build-fuzz/"$t".log 2>&1; then
    rc=1
    echo "fuzz.sh: $t FAILED; the input is in build-fuzz/crashes/ (log: build-fuzz/$t.log):"
    grep -E "ERROR|SUMMARY|Test unit written" build-fuzz/"$t".log | head -5
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" build-fuzz/"$t".log | tr '\n' ' '
    echo "(corpus: $(find "$work" -type f | wc -l) inputs)"
  fi
done
if [ -n "$skipped" ]; then
  echo "fuzz.sh: SKIPPED libFuzzer targets ${c_targets[*]} ($skipped)"
fi
exit $rc
