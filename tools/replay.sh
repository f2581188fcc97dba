#!/usr/bin/env bash
# The README's main job: build xseg if needed and replay the bundled workloads (transformer
# training with changing sequence lengths, an LLM inference server) in classic and expandable
# mode side by side, on the GPU when there is one and on the emulator (cudaemu) otherwise.
# Installs the build tools it lacks (Debian packages), like tools/test.sh.
#   tools/replay.sh                 the bundled workloads, side by side
#   tools/replay.sh ARGS...         any xseg-replay arguments (e.g. --plot out.svg, a trace file or
#                                   a PyTorch snapshot); relative paths are the caller's, as for
#                                   any command: the build happens in the checkout, the replay here
#   XSEG_BUILD_DIR=DIR              the build folder (default: build in the checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${XSEG_BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$PWD/$build ;; esac

(
  cd "$root"
  . tools/ensure-build-tools.sh
  ensure_build_tools replay.sh
  if [ ! -f "$build/build.ninja" ]; then
    echo "tools/replay.sh: configuring the build in $build (meson setup)" >&2
    meson setup "$build" >/dev/null
  fi
  # Say so before a build that has work to do (a minute or so the first time), not before a no-op.
  if ! ninja -C "$build" -n tools/xseg-replay cudaemu/libcudaemu.so 2>/dev/null | grep -q "no work to do"; then
    echo "tools/replay.sh: building xseg-replay and the emulator (cudaemu) in $build" >&2
  fi
  ninja -C "$build" tools/xseg-replay cudaemu/libcudaemu.so >/dev/null
)
if [ $# -eq 0 ]; then
  echo "tools/replay.sh: replaying the bundled workloads (builtin:training, builtin:inference) in classic" \
       "and expandable mode, then searching PyTorch's configs for each verdict (under a minute); for your" \
       "own workload: tools/replay.sh FILE.pickle (a PyTorch snapshot) or FILE.trace" >&2
  exec "$build/tools/xseg-replay" --compare
fi
echo "tools/replay.sh: xseg-replay $*" >&2
exec "$build/tools/xseg-replay" "$@"
