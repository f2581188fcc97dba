#!/bin/sh
# Builds python/xseg/_torch_adapter.cpp against a real PyTorch's headers, with the flags
# torch.utils.cpp_extension.load() passes for that release (tests/torch_headers/README.md):
#   2.6  Debian trixie's libtorch-cuda-dev (contrib; a CUDA build) with trixie's pybind11-dev
#   sid  the newest libtorch-dev (Debian sid) with sid's pybind11-dev
# and checks that everything the object needs of PyTorch is exported: declared with an export
# macro (the headers are read under `#pragma GCC visibility push(hidden)`, so a reference to a
# declaration without one is hidden in the object), and defined in the dynamic symbols of the
# release's own shared libraries (the runtime package the -dev package depends on: libtorch_cuda,
# libtorch, libc10, libc10_cuda ... for 2.6; sid's is a CPU build, whose CUDA libraries' names are
# judged by the declarations alone). tests/torch_headers/exports.py does the checking.
# The .debs come through apt's own client into a private state folder (nothing of the system's
# apt configuration changes; the mirror is the first Debian archive named in
# /etc/apt/sources.list*), are kept in $XSEG_TORCH_DEBS (default SRCROOT/.torch-real, git-ignored)
# and unpacked there with dpkg-deb -x; of a runtime package only its libraries' dynamic symbol
# tables are kept (syms/), the package and its libraries are deleted once read. The package index
# is refreshed when older than a week.
# Exit 77 (meson: skipped) with the reason when a package, apt, a mirror or Python.h is missing.
# Usage: real.sh SRCROOT CXX RELEASE CUDA_INCLUDE_DIR
set -u
root=$1 cxx=$2 rel=$3 cudainc=$4
cache=${XSEG_TORCH_DEBS:-$root/.torch-real}
skip() { echo "SKIP torch $rel: $*"; exit 77; }
fail() { echo "FAIL torch $rel: $*"; exit 1; }

case $rel in
2.6) pkgs="libtorch-cuda-dev/trixie pybind11-dev/trixie" std=c++17 hooks="ensureExistsAndIncrefPool getPoolUseCount"
    host_on= ;;
sid) pkgs="libtorch-dev/sid pybind11-dev/sid" std=c++20 hooks="createOrIncrefPool getPoolUseCount setUseOnOOM setNoSplit"
    host_on=1 ;;
*) fail "unknown release '$rel' (2.6 or sid)" ;;
esac
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || skip "no apt-get/dpkg-deb here"
[ -f "$cudainc/cuda_runtime_api.h" ] || skip "no cuda_runtime_api.h in $cudainc (the CUDA toolkit headers)"
pyinc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) || pyinc=
[ -f "$pyinc/Python.h" ] || skip "no Python.h (python3-dev) for $(command -v python3 || echo python3)"

# The machine's Debian mirror: the first URI of a deb line or deb822 stanza that is not the
# security archive.
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    sed -n -e 's/^deb \(\[[^]]*\] *\)\{0,1\}\(https\{0,1\}:[^ ]*\).*/\2/p' -e 's/^URIs: *\(https\{0,1\}:[^ ]*\).*/\1/p' |
    grep -v -e security -e '^$' | grep '/debian/\{0,1\}$' | head -1)
[ -n "$mirror" ] || skip "no Debian mirror in /etc/apt/sources.list*"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || skip "no $keyring (debian-archive-keyring) to check the archive's signature"

mkdir -p "$cache/apt/lists/partial" "$cache/apt/archives/partial" "$cache/apt/parts" "$cache/debs" "$cache/tree" ||
    fail "cannot create $cache"
cat >"$cache/apt/sources.list" <<EOF
deb [signed-by=$keyring] $mirror trixie main contrib
deb [signed-by=$keyring] $mirror sid main
EOF
: >>"$cache/apt/status"
apt() { # apt-get with every state, cache and configuration path inside $cache
    "$@" -o Dir::State="$cache/apt" -o Dir::State::Lists="$cache/apt/lists" \
        -o Dir::State::status="$cache/apt/status" -o Dir::Cache="$cache/apt" \
        -o Dir::Cache::archives="$cache/apt/archives" -o Dir::Etc::SourceList="$cache/apt/sources.list" \
        -o Dir::Etc::SourceParts="$cache/apt/parts" -o Dir::Etc::PreferencesParts="$cache/apt/parts" \
        -o Dir::Etc::Preferences="$cache/apt/parts/none" -o Acquire::Languages=none \
        -o APT::Sandbox::User=root -o Debug::NoLocking=1
}

# One fetcher at a time (the two releases run as parallel tests and share the index).
exec 9>"$cache/lock"
flock 9 2>/dev/null || true
log=$cache/apt/last.log
if [ -z "$(find "$cache/apt/lists" -name '*sid_main*Packages*' -mtime -7 2>/dev/null)" ]; then
    apt apt-get -q update >"$log" 2>&1 || skip "apt-get update from $mirror failed: $(grep -E '^(E|W):' "$log" | head -2 | tr '\n' ' ')"
fi
debs=
for p in $pkgs; do
    name=${p%/*} suite=${p#*/}
    ver=$(apt apt-cache policy "$name" 2>/dev/null | awk -v s="$suite" '
        $2 ~ /^[a-z]+:/ { if (index($0, " " s "/") && v != "") { print v; exit } next }
        $1 == "***" { v = $2; next } NF == 2 && $0 ~ /^     / { v = $1 }')
    [ -n "$ver" ] || skip "$name is not in $suite at $mirror"
    deb=$(ls "$cache/debs/${name}_$(echo "$ver" | sed 's/:/%3a/')_"*.deb 2>/dev/null | head -1)
    if [ -z "$deb" ]; then
        (cd "$cache/debs" && apt apt-get -q download "$name=$ver") >"$log" 2>&1 ||
            skip "apt-get download $name=$ver failed: $(grep -E '^(E|W):' "$log" | head -2 | tr '\n' ' ')"
        deb=$(ls "$cache/debs/${name}_$(echo "$ver" | sed 's/:/%3a/')_"*.deb | head -1)
    fi
    tree=$cache/tree/$(basename "$deb" .deb)
    if [ ! -f "$tree/.done" ]; then
        rm -rf "$tree" && dpkg-deb -x "$deb" "$tree" && touch "$tree/.done" || fail "dpkg-deb -x $deb failed"
    fi
    debs="$debs $tree"
    if [ "${name#libtorch}" != "$name" ]; then
        torch=$tree/usr/include
        # The libraries it is built for: the libtorch package its Depends names, at that version.
        runtime=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' |
            sed -n 's/^ *\(libtorch[^ ]*\) *(= *\([^)]*\)).*/\1=\2/p' | head -1)
    fi
    [ "$name" = pybind11-dev ] && pybind=$tree/usr/include
done
# The runtime package's exported symbols (syms/NAME_VERSION.syms), fetched once.
libsyms= libskip=
if [ -z "$runtime" ]; then
    libskip="the -dev package names no libtorch runtime package with its version"
else
    rname=${runtime%%=*} rver=${runtime#*=}
    libsyms=$cache/syms/${rname}_$(echo "$rver" | sed 's/:/%3a/').syms
    if [ ! -s "$libsyms" ]; then
        mkdir -p "$cache/syms" "$cache/rt"
        rm -f "$cache/rt/"*.deb
        if (cd "$cache/rt" && apt apt-get -q download "$runtime") >"$log" 2>&1; then
            rdeb=$(ls "$cache/rt/"*.deb | head -1)
            rtree=$cache/rt/tree
            rm -rf "$rtree" && mkdir -p "$rtree" &&
                dpkg-deb --fsys-tarfile "$rdeb" | tar -x -C "$rtree" --wildcards './usr/lib/*/lib*.so.*' ||
                fail "cannot unpack the libraries of $rdeb"
            : >"$libsyms.tmp"
            for lib in $(find "$rtree" -type f -name 'lib*.so.*' | sort); do
                echo "# $(basename "$lib")" >>"$libsyms.tmp"
                nm -D --defined-only "$lib" | awk '{ print $NF }' >>"$libsyms.tmp" || fail "nm -D $lib failed"
            done
            mv "$libsyms.tmp" "$libsyms"
            rm -rf "$rtree" "$rdeb"
        else
            libsyms= libskip="apt-get download $runtime failed: $(grep -E '^(E|W):' "$log" | head -2 | tr '\n' ' ')"
        fi
    fi
fi
flock -u 9 2>/dev/null || true

version=$(sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
    "$torch/torch/csrc/api/include/torch/version.h" "$torch/torch/headeronly/version.h" 2>/dev/null | paste -sd.)
# A CPU build (libtorch-dev) lacks the one generated header of c10's CUDA part; a CUDA build's
# says only that c10_cuda is a shared library.
shim=$cache/tree/cuda-shim
mkdir -p "$shim/c10/cuda/impl"
[ -f "$shim/c10/cuda/impl/cuda_cmake_macros.h" ] ||
    printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$shim/c10/cuda/impl/cuda_cmake_macros.h"
extra=
[ -f "$torch/c10/cuda/impl/cuda_cmake_macros.h" ] || extra="-isystem $shim"

# cpp_extension.load(with_cuda=True) for a .cpp source: the extension-name and pybind11 ABI
# defines, -isystem torch's include folders, CUDA's and Python's, the libstdc++ ABI, -fPIC and
# the release's C++ standard; then xseg.torch.enable()'s own -I and -O2. -Werror=overloaded-virtual
# turns a hidden (not overridden) virtual of PyTorch's into a failure.
obj=$(mktemp /tmp/xseg-torch-real.XXXXXX.o)
trap 'rm -f "$obj"' EXIT
# The prelude hides every declaration that follows unless it carries an export macro (what
# PyTorch's -fvisibility=hidden build does to its definitions); it changes nothing else.
set -- -include "$root/tests/torch_headers/visibility_hidden.h" -DTORCH_EXTENSION_NAME=xseg_torch_adapter_real -DTORCH_API_INCLUDE_EXTENSION_H \
    '-DPYBIND11_COMPILER_TYPE="_gcc"' '-DPYBIND11_STDLIB="_libstdcpp"' '-DPYBIND11_BUILD_ABI="_cxxabi1018"' \
    -I "$root/include" -isystem "$torch" -isystem "$torch/torch/csrc/api/include" $extra \
    -isystem "$pybind" -isystem "$cudainc" -isystem "$pyinc" -D_GLIBCXX_USE_CXX11_ABI=1 -fPIC -std=$std -O2 \
    -Wall -Wno-unused-parameter -Werror=overloaded-virtual -Werror=return-type
[ -d "$torch/TH" ] && set -- "$@" -isystem "$torch/TH"
[ -d "$torch/THC" ] && set -- "$@" -isystem "$torch/THC"
out=$cache/last-$rel.log
if ! "$cxx" "$@" -c "$root/python/xseg/_torch_adapter.cpp" -o "$obj" >"$out" 2>&1; then
    cat "$out"
    fail "the adapter does not build against PyTorch $version's headers ($(echo $debs | tr ' ' '\n' | sed 's,.*/,,' | tr '\n' ' '))"
fi
grep -E "warning|error" "$out" | head -20
# Everything the object needs of PyTorch: declared for export, and (where the runtime package was
# had) in its libraries' dynamic symbols; a CPU build has no libtorch_cuda or libc10_cuda, whose
# names are then judged by their declarations only.
unjudged=
if [ -n "$libsyms" ] && ! grep -q '^# libtorch_cuda\.so' "$libsyms"; then
    unjudged="torch::cuda:: c10::cuda:: at::cuda::"
fi
set -- --nm "$(command -v nm)" --object "$obj" --hidden
[ -n "$libsyms" ] && set -- "$@" --defined "$libsyms"
[ -n "$unjudged" ] && set -- "$@" --unjudged $unjudged
python3 "$root/tests/torch_headers/exports.py" "$@" ||
    fail "the adapter needs a symbol PyTorch $version does not export (above): it would not load"
libnote=
[ -n "$libsyms" ] || libnote="the adapter builds for PyTorch $version and needs only declarations it exports, but its libraries were not checked: $libskip"
# The hooks the adapter must define for both releases (the adapter class or one of its mixins):
# a detection that silently stopped matching the real header would drop one.
XSEG_HOOKS="getDeviceStats resetPeakStats cacheInfo snapshot recordHistory attachOutOfMemoryObserver name
    isHistoryEnabled attachAllocatorTraceTracker enablePeerAccess getCheckpointState setCheckpointPoolState
    memcpyAsync shareIpcHandle getIpcDevPtr getMemoryFraction"
for sym in $XSEG_HOOKS $hooks; do
    nm -C --defined-only "$obj" 2>/dev/null | grep -q "(anonymous namespace)::.*::$sym(" ||
        fail "the adapter defines no $sym for PyTorch $version (a detection no longer matches its header)"
done
# The allocator allocates and frees its blocks itself, so PyTorch's wrapper never keeps them.
for sym in allocate raw_deleter raw_alloc raw_alloc_with_stream raw_delete; do
    nm -C --defined-only "$obj" 2>/dev/null | grep -q "(anonymous namespace)::XsegAllocator::$sym(" ||
        fail "the adapter's allocator defines no $sym for PyTorch $version"
done
# xseg's pinned host allocator (at::HostAllocator, 2.8 and later) with the pool hooks CUDA graph
# capture calls; none for a release without the registry.
XSEG_HOST_HOOKS="allocate record_event empty_cache get_stats reset_accumulated_stats reset_peak_stats
    begin_allocate_to_pool end_allocate_to_pool release_pool"
for sym in $XSEG_HOST_HOOKS; do
    if nm -C --defined-only "$obj" 2>/dev/null | grep -q "(anonymous namespace)::.*Host.*::$sym("; then
        [ -n "$host_on" ] || fail "the adapter defines a host allocator ($sym) for PyTorch $version, which has no registry"
    else
        [ -z "$host_on" ] || fail "the adapter defines no host allocator $sym for PyTorch $version (at::HostAllocator)"
    fi
done
echo "ok   PyTorch $version ($rel, -std=$std): the adapter builds ($(echo $debs | tr ' ' '\n' | sed 's,.*/,,' | tr '\n' ' '))"
[ -z "$libnote" ] || skip "$libnote"
echo "ok   PyTorch $version: every symbol the adapter needs is exported ($(basename "$libsyms" .syms)$([ -n "$unjudged" ] && echo ", a CPU build: $unjudged by declaration"))"
