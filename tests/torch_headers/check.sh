#!/bin/sh
# Signature check of the PyTorch adapter (python/xseg/_torch_adapter.cpp) against the stub headers
# of several PyTorch interfaces (tests/torch_headers/README.md): each must compile (-fsyntax-only),
# and no virtual function of PyTorch's may be hidden by a declaration of the adapter (the snapshot
# and recordHistory variants: the one matching the interface must override). Then two negative
# controls: a stub tree whose version macro lies must fail, so the version guards are exercised.
# Usage: check.sh SRCROOT [C++ compiler]
set -u
root=$1
cxx=${2:-c++}
here=$root/tests/torch_headers
adapter=$root/python/xseg/_torch_adapter.cpp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

compile() { # dir -> compiler output in $tmp/out, status returned
    "$cxx" -std=c++17 -fsyntax-only -Wall -Wno-unused-parameter -Woverloaded-virtual \
        -I "$1" -I "$here/common" -I "$root/include" "$adapter" >"$tmp/out" 2>&1
}

for iface in v2.1 v2.3 v2.8 main; do
    if ! compile "$here/$iface"; then
        echo "FAIL $iface: the adapter does not compile against this interface"
        cat "$tmp/out"
        fail=1
    elif grep -q "_torch_adapter.cpp:[0-9]*:[0-9]*: note: *by" "$tmp/out"; then
        echo "FAIL $iface: a virtual function of PyTorch's is hidden, not overridden, by the adapter"
        cat "$tmp/out"
        fail=1
    else
        echo "ok   $iface"
    fi
done

# Negative controls: the 2.1 interface announced as 2.3, and the newest announced as 2.2.
lie() { # iface minor
    rm -rf "$tmp/lie"
    cp -R "$here/$1" "$tmp/lie"
    sed -i "s/#define TORCH_VERSION_MINOR .*/#define TORCH_VERSION_MINOR $2/" "$tmp/lie/torch/version.h"
    if compile "$tmp/lie"; then
        echo "FAIL control: $1 announced as 2.$2 compiled; the version guards are not checked"
        fail=1
    else
        echo "ok   control: $1 announced as 2.$2 is refused"
    fi
}
lie v2.1 3
lie main 2
exit $fail
