#!/usr/bin/env python3
"""What the PyTorch adapter needs of libtorch and c10, against what exports it
(tests/torch_headers/README.md).

  exports.py --nm NM --module ADAPTER.so --stand-in LIBFAKE_TORCH.so --list torch-2.11-exports.txt
      The adapter module built against the newest stub interface (tests/build): every PyTorch
      symbol it leaves undefined must be exported by the stand-in libtorch (built with hidden
      visibility); none may be one 2.11's import reported missing, and none of
      CUDAPluggableAllocator's members one 2.11's libtorch_cuda.so does not export where its
      listing reaches. The stand-in itself may export no member of the class there that 2.11 does
      not, and nothing 2.11 was missing.

  exports.py --nm NM --object ADAPTER.o --defined SYMS... [--unjudged PREFIX...] [--hidden]
      real.sh: the adapter object built against a real PyTorch's headers. Every PyTorch symbol it
      leaves undefined must be in one of the SYMS files (`nm -D --defined-only` of that release's
      libraries), except those of an --unjudged namespace (libraries the release's package lacks). --hidden also fails on every undefined PyTorch symbol whose
      declaration carries no export macro (the object is compiled with the headers under
      `#pragma GCC visibility push(hidden)`, so such a reference is STV_HIDDEN).

Exit 0 when all holds, 1 with each failure on its own line.
"""
import argparse
import os
import shutil
import subprocess
import sys

# Symbols of PyTorch's libraries: these namespaces, also behind the ABI's prefixes.
NAMESPACES = ("c10::", "torch::", "at::", "caffe2::")
PREFIXES = ("typeinfo name for ", "typeinfo for ", "vtable for ", "VTT for ", "construction vtable for ",
            "guard variable for ", "non-virtual thunk to ", "virtual thunk to ", "covariant return thunk to ")
CLASS = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator"


def bare(demangled):
    """The entity a symbol belongs to: its demangled name without the ABI's prefix."""
    for p in PREFIXES:
        if demangled.startswith(p):
            return demangled[len(p):]
    return demangled


def torch_symbol(demangled):
    return bare(demangled).startswith(NAMESPACES)


def demangle(names, cxxfilt):
    if not names:
        return {}
    out = subprocess.run([cxxfilt], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    if len(lines) != len(names):
        sys.exit("exports.py: %s gave %d lines for %d names" % (cxxfilt, len(lines), len(names)))
    return dict(zip(names, lines))


def nm_names(nm, path, *flags):
    """Symbol names (versions stripped) of `nm FLAGS path`."""
    out = subprocess.run([nm, *flags, path], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("exports.py: %s %s %s: %s" % (nm, " ".join(flags), path, out.stderr.strip()))
    names = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if parts:
            names.append(parts[-1].split("@")[0])
    return names


def hidden_undefined(readelf, path):
    """Undefined symbols of an object whose declaration gave them hidden visibility."""
    out = subprocess.run([readelf, "-sW", path], capture_output=True, text=True, check=True)
    names = set()
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[6] == "UND" and f[5] != "DEFAULT":
            names.add(f[7].split("@")[0])
    return names


def read_list(path):
    spec = {"covered": None, "missing": set(), "later": [], "exported": set()}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            key, _, rest = line.partition(" ")
            if key == "covered-through":
                spec["covered"] = rest
            elif key == "missing":
                spec["missing"].add(rest)
            elif key == "later":
                spec["later"].append(rest)
            elif key == "exported":
                lib, kind, name = rest.split(" ", 2)
                spec["exported"].add(name)
            else:
                sys.exit("exports.py: %s: unknown line %r" % (path, line))
    if not spec["covered"] or not spec["exported"]:
        sys.exit("exports.py: %s: no covered-through or exported lines" % path)
    return spec


def check_module(args, cxxfilt, fail):
    needs = nm_names(args.nm, args.module, "-D", "--undefined-only")
    given = set(nm_names(args.nm, args.stand_in, "-D", "--defined-only"))
    names = demangle(sorted(set(needs) | given), cxxfilt)
    needs = sorted(m for m in set(needs) if torch_symbol(names[m]))
    print("the adapter needs %d symbols of PyTorch's libraries:" % len(needs))
    for m in needs:
        print("     %s" % names[m])
    for m in needs:
        if m not in given:
            fail("the adapter needs %s (%s), which the stand-in libtorch does not export" % (names[m], m))

    spec = read_list(args.list)
    bound = spec["covered"]

    def judged(m):  # a member of the class where 2.11's listing reaches
        return m.startswith(CLASS) and m <= bound

    def later(m):
        return any(names[m].startswith(p) for p in spec["later"])

    listed = 0
    for m in needs:
        if m in spec["missing"]:
            fail("the adapter needs %s, which PyTorch 2.11's import reported undefined" % names[m])
        elif judged(m) and names[m] not in spec["exported"] and not later(m):
            fail("the adapter needs %s, which PyTorch 2.11's libtorch_cuda.so does not export" % names[m])
        elif names[m] in spec["exported"]:
            listed += 1
    print("ok   %d of them are in 2.11's listing" % listed if listed else "     none of them is in 2.11's listing")
    # The stand-in against 2.11, where the listing reaches: it exports no more of the class.
    for m in sorted(given):
        if m in spec["missing"]:
            fail("the stand-in exports %s, which PyTorch 2.11 does not" % names[m])
        elif judged(m) and names[m] not in spec["exported"] and not later(m):
            fail("the stand-in exports %s, which PyTorch 2.11's libtorch_cuda.so does not" % names[m])
    # The listing's order is nm's mangled order, which the bound relies on: a listed member of
    # libtorch_cuda.so that the stand-in exports too must sort within it.
    for m in sorted(given):
        if m.startswith(CLASS) and names[m] in spec["exported"] and m > bound and \
                not any(g <= bound and names[g] == names[m] for g in given):
            fail("2.11's listing holds %s, whose mangled name %s sorts after its bound: the bound is wrong"
                 % (names[m], m))


def check_object(args, cxxfilt, fail):
    needs = nm_names(args.nm, args.object, "--undefined-only")
    names = demangle(sorted(set(needs)), cxxfilt)
    needs = sorted(m for m in set(needs) if torch_symbol(names[m]))
    defined = set()
    for path in args.defined:
        with open(path, encoding="utf-8") as f:
            defined.update(line.split()[-1].split("@")[0] for line in f if line.strip() and not line.startswith("#"))
    hidden = hidden_undefined(args.readelf, args.object) if args.hidden else set()
    unjudged = 0
    for m in needs:
        if m in hidden:
            fail("the adapter needs %s, which this PyTorch declares without an export macro" % names[m])
        if m in defined:
            continue
        if any(bare(names[m]).startswith(p) for p in args.unjudged):
            unjudged += 1
            continue
        if args.defined:
            fail("the adapter needs %s (%s), which this PyTorch's libraries do not export" % (names[m], m))
    print("     %d PyTorch symbols needed, %d resolved in its libraries%s%s" % (
        len(needs), sum(m in defined for m in needs),
        ", %d in libraries its package lacks (%s)" % (unjudged, ", ".join(args.unjudged)) if unjudged else "",
        "; every declaration exported" if args.hidden and not hidden & set(needs) else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--module")
    ap.add_argument("--stand-in")
    ap.add_argument("--list")
    ap.add_argument("--object")
    ap.add_argument("--defined", nargs="*", default=[])
    ap.add_argument("--unjudged", nargs="*", default=[])
    ap.add_argument("--hidden", action="store_true")
    args = ap.parse_args()
    tooldir = os.path.dirname(os.path.abspath(args.nm)) if os.sep in args.nm else ""
    cxxfilt = shutil.which("c++filt", path=tooldir or None) or shutil.which("c++filt")
    args.readelf = shutil.which("readelf", path=tooldir or None) or shutil.which("readelf") or "readelf"
    if not cxxfilt:
        sys.exit("exports.py: no c++filt (binutils) next to %s or on PATH" % args.nm)
    failures = []

    def fail(msg):
        failures.append(msg)
        print("FAIL " + msg)

    if args.module:
        if not (args.stand_in and args.list):
            ap.error("--module needs --stand-in and --list")
        check_module(args, cxxfilt, fail)
    elif args.object:
        check_object(args, cxxfilt, fail)
    else:
        ap.error("--module or --object")
    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    print("ok   every PyTorch symbol the adapter needs is exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
