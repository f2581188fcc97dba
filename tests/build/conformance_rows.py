#!/usr/bin/env python3
"""Every driver entry point xseg loads or cudaemu exports has a conformance row the GPU run
compares with the driver: a row of a printed table of tests/driver/test_vmm.c (misuse, capture,
graph, exec) whose text starts with the entry point's name, not marked emulator-only.

The names: vmm/driver.h's DRV_FOREACH_ENTRY (what drv_load() dlsyms) and cudaemu/emu.h's
EMU_FOREACH_ENTRY (what cudaemu exports: xseg's table and the few the tests call besides).
Rows measured on the H100 before this check keep their short names (ALIASES).
Also fails when xseg's table names an entry point cudaemu does not export.
    conformance_rows.py SOURCE_ROOT"""
import re
import sys

ALIASES = {  # the short prefixes of the measured VMM rows
    "reserve": "cuMemAddressReserve", "create": "cuMemCreate", "map": "cuMemMap", "unmap": "cuMemUnmap",
    "set access": "cuMemSetAccess", "address free": "cuMemAddressFree", "retain": "cuMemRetainAllocationHandle",
    "export": "cuMemExportToShareableHandle", "import": "cuMemImportFromShareableHandle",
    "release": "cuMemRelease",
}


def entries(path, macro):
    """The X(name) items of `#define MACRO(X)`, through its last continued line."""
    lines = open(path).read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("#define %s(X)" % macro)), None)
    if start is None:
        sys.exit("%s: no #define %s(X) found" % (path, macro))
    end = start
    while lines[end].rstrip().endswith("\\"):
        end += 1
    block = re.sub(r"/\*.*?\*/", "", "\n".join(lines[start:end + 1]), flags=re.S)
    return set(re.findall(r"\bX\((cu[A-Za-z0-9_]+)\)", block))


def rows(path):
    """Entry point -> row texts, from the table rows the run compares with the driver."""
    out = {}
    text = re.sub(r"/\*.*?\*/", "", open(path).read(), flags=re.S)
    # ROW("...", ...), ROW_STRICTER(...), ROW_DOC(...): compared; ROW_EMU_*: the emulator's only.
    # {"...", ...}: a capture/graph/exec row; an exec row with emu_only true is the emulator's.
    for m in re.finditer(r'(\bROW(?:_[A-Z_]+)?\(|\{)\s*"([^"]*)"\s*,\s*(\w+)', text):
        opener, what, nxt = m.groups()
        if opener.startswith("ROW_EMU") or (opener == "{" and nxt == "true"):
            continue
        name = re.match(r"(cu[A-Za-z0-9_]+)\b", what)
        key = name.group(1) if name else next((v for k, v in ALIASES.items() if what.startswith(k + ":")), None)
        if key:
            out.setdefault(key, []).append(what)
    return out


def main(root):
    drv = entries(root + "/vmm/driver.h", "DRV_FOREACH_ENTRY")
    emu = entries(root + "/cudaemu/emu.h", "EMU_FOREACH_ENTRY")
    have = rows(root + "/tests/driver/test_vmm.c")
    bad = 0
    for n in sorted(drv - emu):
        print("%s: in xseg's driver table (vmm/driver.h) but not exported by cudaemu (cudaemu/emu.h)" % n)
        bad += 1
    for n in sorted(drv | emu):
        if n not in have:
            print("%s: no conformance row in tests/driver/test_vmm.c (a compared table row whose text "
                  "starts with \"%s:\")" % (n, n))
            bad += 1
    print("%d entry points (%d in xseg's driver table, %d exported by cudaemu), %d rows compared, %d without one"
          % (len(drv | emu), len(drv), len(emu), sum(len(v) for v in have.values()), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
