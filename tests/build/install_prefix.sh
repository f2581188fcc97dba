#!/bin/sh
# A user's install to a prefix, as README.md prints it: `meson setup --prefix=$HOME/.local`,
# `meson install`, then the Python package imported from there allocates with no XSEG_LIBRARY and
# no loader path (it loads the libxseg installed with it), setup says where the package went and
# why when that Python does not import from there, and README's C install commands (the block
# tagged `<!-- test: install-c -->`) build and run README's example as printed. With XSEG_LIBCUDA
# set (the emulator tests), the installed emulator stands in for the driver, as README says.
# Usage: install_prefix.sh MESON SOURCE_ROOT PYTHON
set -u
meson=$1 src=$2 python=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
unset LD_LIBRARY_PATH XSEG_LIBRARY PYTHONPATH
emulate=${XSEG_LIBCUDA:+yes}
export HOME=$tmp
prefix=$HOME/.local

"$meson" setup "$tmp/build" "$src" --prefix="$prefix" -Dtests=disabled -Dbenchmarks=false \
    >"$tmp/setup.txt" 2>&1 || { cat "$tmp/setup.txt"; fail "meson setup"; }
ninja -C "$tmp/build" >"$tmp/build.txt" 2>&1 || { tail -30 "$tmp/build.txt"; fail "ninja"; }
"$meson" install -C "$tmp/build" >"$tmp/install.txt" 2>&1 || { cat "$tmp/install.txt"; fail "meson install"; }

init=$("$meson" introspect --installed "$tmp/build" | "$python" -c '
import json, sys
print(next(v for v in json.load(sys.stdin).values() if v.endswith("/xseg/__init__.py")))')
pydir=$(dirname "$(dirname "$init")")
libdir=$(dirname "$(find "$prefix" -name 'libxseg.so.0' | head -1)")
echo "ok   installed: package in $pydir, library in $libdir"

# Where the package went is on that Python's sys.path, or setup and install said it is not.
if "$python" -E -c 'import os, sys; sys.exit(os.path.normpath(sys.argv[1]) not in [os.path.normpath(p) for p in sys.path])' "$pydir"; then
    echo "ok   $pydir is on $python's sys.path"
else
    grep -q "WARNING: the Python package goes to $pydir, which .* does not import from" "$tmp/setup.txt" ||
        { cat "$tmp/setup.txt"; fail "setup did not say that $python does not import from $pydir"; }
    grep -q "xseg: note: the Python package goes to $pydir" "$tmp/install.txt" ||
        { cat "$tmp/install.txt"; fail "install did not say where the package went"; }
    echo "ok   setup and install say $pydir is not on $python's sys.path"
fi

# The install-python test holds for this prefix too (it assumed the default one, whose folders
# Python reads): into a DESTDIR, from this build, with the package imported through PYTHONPATH.
sh "$src/tests/build/install_python.sh" "$meson" "$tmp/build" "$python" "$pydir" "$libdir" "$prefix" ||
    fail "tests/build/install_python.sh with the prefix $prefix"

[ -n "$emulate" ] && export XSEG_LIBCUDA="$libdir/xseg/libcudaemu.so"
(cd "$tmp" && PYTHONPATH=$pydir "$python" -s -c '
import os, sys
import xseg
prefix = sys.argv[1]
assert xseg.__file__.startswith(prefix + "/"), xseg.__file__
assert xseg.library_path().startswith(prefix + "/"), xseg.library_path()
p = xseg.malloc(3 << 20)
assert xseg.memory_allocated(0) == 3 << 20
xseg.free(p)
xseg.empty_cache()
print("ok   python: allocated and freed over", xseg.library_path())
' "$prefix") || fail "the package installed to $prefix does not work by itself"

# README's C example and its install commands, verbatim, in a scratch folder.
block() { # the fenced block after the line `<!-- test: $1 -->` in README.md
    awk -v tag="<!-- test: $1 -->" '$0 == tag { want = 1; next }
        want && /^```/ { if (on) exit; on = 1; next } on { print }' "$src/README.md"
}
awk '/^## Using it/ { u = 1 } /^```c$/ && u { on = 1; n++; next } /^```/ { on = 0 } on && n == 1 { print }' \
  "$src/README.md" >"$tmp/example.c"
block install-c >"$tmp/install-c.sh"
[ -s "$tmp/install-c.sh" ] || fail "README.md has no block tagged <!-- test: install-c -->"
out=$(cd "$tmp" && sh -e "$tmp/install-c.sh" 2>&1) || { cat -n "$tmp/install-c.sh"; fail "README's install commands: $out"; }
echo "$out" | grep -q "^reserved after empty_cache: 0 bytes$" || { cat -n "$tmp/install-c.sh"; fail "unexpected output: $out"; }
echo "ok   README's C install commands: $out"
