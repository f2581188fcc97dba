#!/usr/bin/env bash
# The README's main job: build xseg if needed and replay the bundled workloads (transformer
# training with changing sequence lengths, an LLM inference server) in classic and expandable
# mode side by side, on the GPU when there is one and on the emulator (cudaemu) otherwise.
# Installs the build tools it lacks (Debian packages), like tools/test.sh.
#   tools/replay.sh                 the bundled workloads, side by side
#   tools/replay.sh ARGS...         any xseg-replay arguments (e.g. --plot out.svg, a trace file)
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v meson >/dev/null || need+=(meson)
command -v ninja >/dev/null || need+=(ninja-build)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v cc >/dev/null || need+=(gcc)
pkg-config --exists cmocka 2>/dev/null || need+=(libcmocka-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "replay.sh: installing ${need[*]}"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -f build/build.ninja ]; then
  meson setup build >/dev/null
fi
ninja -C build tools/xseg-replay cudaemu/libcudaemu.so >/dev/null
if [ $# -eq 0 ]; then
  exec build/tools/xseg-replay --compare
fi
exec build/tools/xseg-replay "$@"
