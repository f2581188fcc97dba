#!/bin/sh
# Print xseg's version, MAJOR.MINOR.PATCH, from include/xseg.h (the one place it lives): meson's
# project() reads it, and through meson the Python package's metadata and xseg.__version__.
h="$(dirname "$0")/../include/xseg.h"
v=
for part in MAJOR MINOR PATCH; do
    n=$(sed -n "s/^#define XSEG_API_VERSION_$part \([0-9][0-9]*\)\$/\1/p" "$h")
    case $n in
    '' | *[!0-9]*)
        echo "build-aux/version.sh: no single '#define XSEG_API_VERSION_$part N' in $h" >&2
        exit 1
        ;;
    esac
    v=${v:+$v.}$n
done
echo "$v"
