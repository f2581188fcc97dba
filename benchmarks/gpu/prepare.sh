#!/usr/bin/env bash
# Run on a machine with internet and ../shared (not on the GPU machine): prepares what the bare
# GPU machine lacks, in two git-ignored folders that the device tool carries with the checkout.
#   .gpu-traces/NAME.trace.gz  every snapshot of ../shared/traces converted by
#                              tools/snapshot2trace.py --no-frames (xseg's text trace format)
#   .gpu-deps/*.deb            Debian packages, downloaded (apt-get download), never installed:
#                              cmocka for the test suites, pkgconf to find it, meson and ninja
#                              where the image has none, pytest for tests/python. run.sh unpacks
#                              them into a private prefix (benchmarks/gpu/unpack_deb.py).
# usage: benchmarks/gpu/prepare.sh [SHARED_DIR]   (default ../shared)
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=${1:-../shared}
mkdir -p .gpu-traces .gpu-deps
n=0
for p in "$shared"/traces/*/*.pickle; do
    [ -f "$p" ] || continue
    name=$(basename "$(dirname "$p")")-$(basename "$p" .pickle)
    dst=.gpu-traces/$name.trace.gz
    if [ ! -s "$dst" ] || [ "$p" -nt "$dst" ]; then
        if python3 tools/snapshot2trace.py --no-frames "$p" > ".gpu-traces/$name.trace.tmp" 2> ".gpu-traces/$name.err"; then
            gzip -9 -c ".gpu-traces/$name.trace.tmp" > "$dst"
            rm -f ".gpu-traces/$name.err"
        else
            echo "prepare: $p does not convert: $(tail -1 ".gpu-traces/$name.err")" >&2
        fi
        rm -f ".gpu-traces/$name.trace.tmp"
    fi
    n=$((n + 1))
done
echo "prepare: $n snapshots -> $(ls .gpu-traces/*.trace.gz 2>/dev/null | wc -l) traces in .gpu-traces ($(du -sh .gpu-traces | cut -f1))"
# Pure-Python packages work with any Python 3; the binaries need glibc >= 2.34 (Debian 12 builds).
pkgs="libcmocka0 libcmocka-dev pkgconf pkgconf-bin libpkgconf3 meson ninja-build
      python3-pytest python3-pluggy python3-iniconfig python3-packaging python3-attr"
(cd .gpu-deps && apt-get download $pkgs 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
echo "prepare: $(ls .gpu-deps/*.deb | wc -l) packages in .gpu-deps ($(du -sh .gpu-deps | cut -f1))"
