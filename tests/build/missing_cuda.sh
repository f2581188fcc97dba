#!/bin/sh
# `meson setup` without the CUDA toolkit headers must stop with xseg's own message, naming
# cuda.h and what to install, not with a meson internals error.
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$(CUDA_PATH="$tmp/no-cuda-here" meson setup "$tmp/build" "$src" 2>&1)
if [ $? -eq 0 ]; then echo "meson setup succeeded without cuda.h"; exit 1; fi
echo "$out" | grep -q "cuda.h not found under $tmp/no-cuda-here/include" || { echo "unexpected message:"; echo "$out"; exit 1; }
echo "$out" | grep -q "CUDA_PATH" || { echo "message does not say how to point at a toolkit"; exit 1; }
echo "ok: $(echo "$out" | grep 'cuda.h not found')"
