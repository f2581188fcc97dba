#!/bin/sh
# Every global symbol a library defines must be public API: xseg_ prefixed. Anything else means an
# internal function escaped: from the shared library (dynamic symbols) through the hidden-visibility
# build, from the static archive because build-aux/static-archive.sh did not localize it. Either
# would clash with an application's own symbol of the same name.
#   exported_symbols.sh LIB...      (.so: dynamic symbol table; .a: global symbols of its members)
set -eu
for lib in "$@"; do
    case $lib in
    *.a) syms=$(nm -g --defined-only "$lib" | awk 'NF == 3 && $2 ~ /^[TDBRVWGSCui]$/ {print $3}') ;;
    *) syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}') ;;
    esac
    [ -n "$syms" ] || { echo "no exported symbols found in $lib"; exit 1; }
    bad=$(printf '%s\n' "$syms" | grep -v '^xseg_' || true)
    if [ -n "$bad" ]; then
        echo "non-xseg symbols exported by $lib:"; printf '%s\n' "$bad"; exit 1
    fi
    printf '%s\n' "$syms" | grep -qx xseg_malloc || { echo "xseg_malloc is not exported by $lib"; exit 1; }
    echo "$lib: $(printf '%s\n' "$syms" | wc -l) exported symbols, all xseg_"
done
