#!/bin/bash
# A fresh machine's fuzzing: tools/ensure-build-tools.sh --tests installs clang (and its libFuzzer
# runtime, where apt knows the package) when clang is missing, with one apt-get update, and asks
# for nothing about clang when it is there; tools/fuzz.sh says clearly, at the start and in its
# last line, which targets it skipped without clang. apt-get, apt-cache, id and the build tools
# are stand-ins on a PATH of their own: nothing is installed.
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A PATH with the build tools present (stubs), root (no sudo), apt-get logging what it is asked.
mkbin() {
  local bin=$1
  mkdir -p "$bin"
  for t in meson ninja pkg-config cc; do printf '#!/bin/sh\nexit 0\n' >"$bin/$t"; done
  printf '#!/bin/sh\necho 0\n' >"$bin/id"
  printf '#!/bin/sh\necho "$*" >>"%s/apt.log"\n' "$tmp" >"$bin/apt-get"
  # apt-cache knows libclang-rt-dev unless $tmp/no-rt exists (an older release without it).
  printf '#!/bin/sh\n[ ! -e "%s/no-rt" ]\n' "$tmp" >"$bin/apt-cache"
  for t in dirname; do ln -s "$(command -v $t)" "$bin/$t"; done
  chmod +x "$bin"/*
}
run_ensure() { # PATH_DIR ARGS...: the installs asked for, one apt-get call a line
  local bin=$1
  shift
  rm -f "$tmp/apt.log"
  PATH=$bin /bin/bash -c ". '$src/tools/ensure-build-tools.sh'; ensure_build_tools t.sh $*" >/dev/null 2>&1 ||
    fail "ensure_build_tools $* failed"
  cat "$tmp/apt.log" 2>/dev/null
}

mkbin "$tmp/bin"
log=$(run_ensure "$tmp/bin" --tests)
echo "$log" | grep -q "^install .* clang libclang-rt-dev$" || fail "no clang and its runtime installed: $log"
[ "$(echo "$log" | grep -c '^update')" = 1 ] || fail "apt-get update not run once: $log"

touch "$tmp/no-rt"
log=$(run_ensure "$tmp/bin" --tests)
echo "$log" | grep -q "^install .* clang$" || fail "clang not installed without the runtime package: $log"
rm "$tmp/no-rt"

log=$(run_ensure "$tmp/bin")
echo "$log" | grep -q clang && fail "clang asked for without --tests: $log"

printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/clang"
chmod +x "$tmp/bin/clang"
log=$(run_ensure "$tmp/bin" --tests)
echo "$log" | grep -q clang && fail "clang asked for although present: $log"
rm "$tmp/bin/clang"

# fuzz.sh without clang: the libFuzzer targets skipped, said first and last; nothing else runs
# (config only, no Python target), exit 0.
out=$(PATH=$tmp/bin /bin/bash "$src/tools/fuzz.sh" 1 config trace 2>&1) || fail "fuzz.sh failed: $out"
echo "$out" | head -1 | grep -q "^fuzz.sh: SKIPPING libFuzzer targets config trace (clang not found" ||
  fail "no skip message first: $out"
echo "$out" | tail -1 | grep -q "^fuzz.sh: SKIPPED libFuzzer targets config trace (clang not found" ||
  fail "no skip message last: $out"
# clang without the libFuzzer runtime: named too.
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/clang"
chmod +x "$tmp/bin/clang"
out=$(PATH=$tmp/bin /bin/bash "$src/tools/fuzz.sh" 1 rmm_csv 2>&1) || fail "fuzz.sh failed: $out"
echo "$out" | tail -1 | grep -q "SKIPPED libFuzzer targets rmm_csv (clang cannot link -fsanitize=fuzzer" ||
  fail "no runtime message: $out"
echo "ok: clang installed when missing; fuzz.sh says what it skipped"
