#!/bin/sh
# `meson install` of the Python package: into a scratch DESTDIR, the package files and libxseg
# must land where the Python meson found imports from (a folder of its sys.path), and the
# installed package, importing from there, must load the installed library by itself (no
# XSEG_LIBRARY, no loader path) and read statistics
# (on cudaemu when XSEG_LIBCUDA names it, as the test environment does).
# Any prefix: where none of the interpreter's folders lies under it (a custom --prefix), meson
# installs to its own folder and says so; the package is then imported through PYTHONPATH.
# Usage: install_python.sh MESON BUILDDIR PYTHON PYDIR LIBDIR PREFIX
set -u
meson=$1 build=$2 python=$3 pydir=$4 libdir=$5 prefix=$6
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest
fail() { echo "FAIL $*"; exit 1; }
unset LD_LIBRARY_PATH # meson test points it at the build tree; the library must come from $dest

"$meson" install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$tmp/install.txt" 2>&1 ||
    { cat "$tmp/install.txt"; fail "meson install --destdir failed"; }

pkg=$dest$pydir/xseg
for f in __init__.py _lib.py torch.py cupy.py ipc.py _torch_adapter.cpp xseg.h xseg_torch.h _version.py; do
    [ -f "$pkg/$f" ] || fail "$pydir/xseg/$f was not installed (installed: $(cd "$dest" && find . -path '*xseg/*.py' | head -3))"
done
lib=$dest$libdir/libxseg.so.0
[ -e "$lib" ] || fail "$libdir/libxseg.so.0 was not installed"
echo "ok   package in $pydir/xseg, library in $libdir"

# The folder is one the interpreter imports from (not, say, a lib/python3/dist-packages that
# Debian's Python does not read) whenever one of its folders lies under the prefix; where none
# does (a custom prefix), meson's own folder, which setup and install said is not on sys.path.
# The same rule as python/meson.build's.
where=$("$python" -E -c '
import os, sys
pydir, prefix = os.path.normpath(sys.argv[1]), os.path.normpath(sys.argv[2])
path = [os.path.normpath(p) for p in sys.path if p]
under = [p for p in path if p.startswith(prefix + os.sep) and os.path.basename(p) in ("site-packages", "dist-packages")]
print("on" if pydir in path else "none" if not under else "missed " + " ".join(under))
' "$pydir" "$prefix") || fail "$python could not run"
case $where in
on) echo "ok   $pydir is on $python's sys.path" ;;
none) echo "ok   no folder of $python's sys.path is under the prefix $prefix: the package went to $pydir" \
          "(meson says to use PYTHONPATH); imported through PYTHONPATH below" ;;
*) fail "$pydir is not on $python's sys.path, though ${where#missed } is under the prefix $prefix" ;;
esac

# Import the installed package (never the source tree's: run from the scratch folder, PYTHONPATH
# naming only the installed folder) with no XSEG_LIBRARY and no loader path: the package loads the
# libxseg of its own installation (the LIBDIR meson recorded, relative to the package).
check='
import os, sys
import xseg, xseg.torch
dest, lib = sys.argv[1], sys.argv[2]
assert xseg.__file__.startswith(dest), xseg.__file__
s = xseg.memory_stats(0)
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libxseg.so" in l]
assert maps and all(os.path.realpath(m) == os.path.realpath(lib) for m in maps), (maps, lib)
assert len(s) == 122 + 9 and s["allocated_bytes.all.current"] == 0, s
p = xseg.malloc(1 << 20)
assert xseg.memory_stats(0)["allocated_bytes.all.current"] == 1 << 20
xseg.free(p)
assert xseg.__version__ == xseg.version(), (xseg.__version__, xseg.version())
assert xseg.torch.header_dir() == os.path.dirname(xseg.__file__), xseg.torch.header_dir()
print("ok   imported", xseg.__file__, "version", xseg.__version__, "over", maps[0])
'
(cd "$tmp" && unset XSEG_LIBRARY && PYTHONPATH=$dest$pydir "$python" -s -c "$check" "$dest" "$lib") ||
    fail "the installed package does not load the libxseg installed with it (no XSEG_LIBRARY)"

# Its own installation comes before XSEG_LIBRARY: a stale variable naming another build (here, one
# that does not exist) does not pair the package with another library.
(cd "$tmp" && PYTHONPATH=$dest$pydir XSEG_LIBRARY=$tmp/elsewhere/libxseg.so "$python" -s -c "$check" "$dest" "$lib") ||
    fail "XSEG_LIBRARY took precedence over the installed package's own libxseg"

# README's Python snippet as printed, from the installed package, with nothing pointing at a
# driver (no XSEG_LIBCUDA): where no GPU driver loads (CI), the package runs on the emulator its
# installation carries (LIBDIR/xseg/libcudaemu.so) and says so in one line; a bad XSEG_EMULATOR is
# refused naming it. Before, set_config raised XSEG_ERROR_DRIVER there.
src=$(cd "$(dirname "$0")/../.." && pwd)
"$python" - "$src/README.md" "$tmp/readme.py" <<'PY' || fail "no python snippet marked 'test: python' in README.md"
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"<!-- test: python[^>]*-->\n```python\n(.*?)```", text, re.S)
assert m, "snippet"
open(sys.argv[2], "w").write(m.group(1))
PY
drv=$("$python" -c 'import ctypes
try:
    ctypes.CDLL("libcuda.so.1"); print("driver")
except OSError:
    print("none")')
(cd "$tmp" && unset XSEG_LIBRARY XSEG_LIBCUDA XSEG_EMULATOR && PYTHONPATH=$dest$pydir "$python" -s readme.py \
    >"$tmp/readme.out" 2>"$tmp/readme.err") ||
    fail "README's Python snippet fails as printed without XSEG_LIBCUDA: $(tail -3 "$tmp/readme.err")"
if [ "$drv" = none ]; then
    grep -q "^xseg: no GPU driver (libcuda.so.1) loads here: running on the emulator this package carries (.*libcudaemu.so" \
        "$tmp/readme.err" || fail "no one-line note of the emulator on stderr: $(cat "$tmp/readme.err")"
    [ "$(wc -l < "$tmp/readme.err")" -eq 1 ] || fail "more than one line on stderr: $(cat "$tmp/readme.err")"
fi
echo "ok   README's Python snippet runs as printed without XSEG_LIBCUDA ($drv)"
(cd "$tmp" && unset XSEG_LIBCUDA && PYTHONPATH=$dest$pydir XSEG_EMULATOR=maybe "$python" -s -c 'import xseg; xseg.memory_stats(0)' \
    2>"$tmp/bad.err") && fail "XSEG_EMULATOR=maybe was accepted"
grep -q "XSEG_EMULATOR='maybe': expected auto, 1 or 0" "$tmp/bad.err" || fail "XSEG_EMULATOR=maybe: $(tail -1 "$tmp/bad.err")"
echo "ok   XSEG_EMULATOR=maybe is refused naming it"
