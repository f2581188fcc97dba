#!/bin/sh
# Every dynamic symbol the shared library defines must be public API: xseg_ prefixed.
# Anything else means an internal function escaped the hidden-visibility build.
set -eu
lib=$1
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}')
[ -n "$syms" ] || { echo "no exported symbols found in $lib"; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^xseg_' || true)
if [ -n "$bad" ]; then
    echo "non-xseg symbols exported by $lib:"; printf '%s\n' "$bad"; exit 1
fi
printf '%s\n' "$syms" | grep -qx xseg_malloc || { echo "xseg_malloc is not exported"; exit 1; }
echo "$(printf '%s\n' "$syms" | wc -l) exported symbols, all xseg_"
