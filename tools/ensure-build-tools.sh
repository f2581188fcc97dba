# Sourced by tools/test.sh and tools/replay.sh: install, from Debian's packages, whatever build
# tool a fresh machine lacks (meson, ninja, pkg-config, a C compiler; cmocka, the Python test
# packages, doxygen and clang, for the API reference's check and the libFuzzer targets of
# tools/fuzz.sh, and chromium, for the xseg-replay --report page's test, only for the tests).
# Nothing is installed (and no root needed) when the tools are present. Uses sudo when not root.
#   ensure_build_tools NAME          the build tools ($1 names the calling script, for messages)
#   ensure_build_tools NAME --tests  and what only the test suites need (cmocka, pytest, doxygen, clang, ...)
ensure_build_tools() {
  local need=() fuzz_rt=0
  command -v meson >/dev/null || need+=(meson)
  command -v ninja >/dev/null || need+=(ninja-build)
  command -v pkg-config >/dev/null || need+=(pkg-config)
  command -v cc >/dev/null || need+=(gcc)
  if [ "${2:-}" = "--tests" ]; then
    pkg-config --exists cmocka 2>/dev/null || need+=(libcmocka-dev)
    # The Python package's suite (tests/python): pytest, and pip + meson-python for `pip install .`
    /usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3-pytest)
    /usr/bin/python3 -c 'import mesonpy' 2>/dev/null || need+=(python3-mesonpy)
    /usr/bin/python3 -c 'import pip' 2>/dev/null || need+=(python3-pip)
    # The API reference's test (api-docs-warnings: every parameter of xseg.h documented).
    command -v doxygen >/dev/null || need+=(doxygen)
    # xseg-replay --report's test loads the page in a headless browser (skipped without one).
    command -v chromium >/dev/null || need+=(chromium)
    # tools/fuzz.sh builds its libFuzzer targets with clang and skips them without it. clang
    # only recommends its libFuzzer runtime, so ask for that too, where apt knows the package.
    if ! command -v clang >/dev/null; then
      need+=(clang)
      fuzz_rt=1
    fi
  fi
  [ ${#need[@]} -gt 0 ] || return 0
  echo "$1: installing ${need[*]}"
  local sudo_=""
  if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "$1: missing ${need[*]} and not root (no sudo): install them (Debian: apt-get install ${need[*]})" >&2
      return 1
    fi
    sudo_=sudo
  fi
  $sudo_ apt-get update -qq
  if [ $fuzz_rt = 1 ] && apt-cache show libclang-rt-dev >/dev/null 2>&1; then
    need+=(libclang-rt-dev)
  fi
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need[@]}" >/dev/null
}
