# Sourced by tools/test.sh and tools/replay.sh: install, from Debian's packages, whatever build
# tool a fresh machine lacks (meson, ninja, pkg-config, a C compiler, cmocka for the tests).
# Uses sudo when not root. $1 names the calling script, for the message.
ensure_build_tools() {
  local need=()
  command -v meson >/dev/null || need+=(meson)
  command -v ninja >/dev/null || need+=(ninja-build)
  command -v pkg-config >/dev/null || need+=(pkg-config)
  command -v cc >/dev/null || need+=(gcc)
  pkg-config --exists cmocka 2>/dev/null || need+=(libcmocka-dev)
  [ ${#need[@]} -gt 0 ] || return 0
  echo "$1: installing ${need[*]}"
  local sudo_=""
  [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need[@]}" >/dev/null
}
