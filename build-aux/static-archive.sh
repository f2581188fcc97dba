#!/bin/sh
# The installed static library: every object of the internal archive linked into one relocatable
# object (ld -r), whose hidden symbols are then made local (objcopy --localize-hidden), archived
# alone. A static link of libxseg.a therefore sees only the public xseg_ entry points: internal
# names (drv, err_set, seg_create, ...) can no longer clash with the application's own symbols.
# The tests and tools inside the tree link the internal archive, which keeps them global.
#   static-archive.sh LD OBJCOPY AR INTERNAL.a OUT.a
set -eu
ld=$1 objcopy=$2 ar=$3 in=$4 out=$5
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tmp=$dir/xseg.o
# --whole-archive: every member, referenced or not (the archive may be thin: ld reads it anyway).
"$ld" -r -o "$tmp" --whole-archive "$in" --no-whole-archive
"$objcopy" --localize-hidden "$tmp"
rm -f "$out"
"$ar" rcs "$out" "$tmp"
