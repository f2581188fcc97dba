#!/bin/sh
# A newcomer's machine without cmocka: `meson setup` still works (tests turn themselves off with
# a message), and the library, cudaemu and xseg-replay build and run; -Dtests=enabled instead
# stops with meson's missing-dependency error. cmocka is hidden with a native file whose
# pkg-config and cmake find nothing.
set -u
src=$1
# A configure-level check: once per CI run is enough (the sanitizer setups scale tests down).
case "${XSEG_TEST_SCALE:-1}" in 1|1.0) ;; *) echo "skip: runs in the plain setup only"; exit 77 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/native.ini" <<EOF2
[binaries]
pkgconfig = 'false'
cmake = 'false'
EOF2
out=$(meson setup --native-file "$tmp/native.ini" -Dbenchmarks=false "$tmp/build" "$src" 2>&1)
if [ $? -ne 0 ]; then echo "meson setup failed without cmocka:"; echo "$out"; exit 1; fi
echo "$out" | grep -q "cmocka not found: tests are not built" || { echo "no message about the tests:"; echo "$out"; exit 1; }
ninja -C "$tmp/build" tools/xseg-replay >"$tmp/ninja.log" 2>&1 || { cat "$tmp/ninja.log"; exit 1; }
"$tmp/build/tools/xseg-replay" --check builtin:training || exit 1
out=$(meson setup --native-file "$tmp/native.ini" -Dtests=enabled "$tmp/build2" "$src" 2>&1)
if [ $? -eq 0 ]; then echo "-Dtests=enabled succeeded without cmocka"; exit 1; fi
echo "$out" | grep -qi "cmocka" || { echo "unexpected message:"; echo "$out"; exit 1; }
echo "ok: setup and build without cmocka"
