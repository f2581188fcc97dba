#!/bin/sh
# The C example in README.md compiles as written (C11, -Wall -Wextra -Werror, only the public
# header) against the built shared library, and runs on the emulator: the README never drifts
# from the API. Usage: readme_example.sh SOURCE_ROOT LIBXSEG_SO_DIR
set -u
src=$1 libdir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The first C block of "Using it" (Quick start's are one-line snippets).
awk '/^## Using it/ { u = 1 } /^```c$/ && u { on = 1; n++; next } /^```/ { on = 0 } on && n == 1 { print }' \
  "$src/README.md" >"$tmp/example.c"
[ -s "$tmp/example.c" ] || { echo "no \`\`\`c block in README.md"; exit 1; }
${CC:-cc} -std=c11 -Wall -Wextra -Werror ${XSEG_EXAMPLE_CFLAGS:-} -I"$src/include" -o "$tmp/example" "$tmp/example.c" \
  -L"$libdir" -lxseg -Wl,-rpath,"$libdir" || { echo "README's C example does not compile:"; cat -n "$tmp/example.c"; exit 1; }
out=$("$tmp/example" 2>&1) || { echo "README's C example failed: $out"; exit 1; }
echo "$out" | grep -q "^reserved after empty_cache: 0 bytes$" || { echo "unexpected output: $out"; exit 1; }
echo "ok: $out"
