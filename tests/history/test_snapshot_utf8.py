#!/usr/bin/env python3
"""Snapshots whose frame strings are not valid UTF-8 (issue 31, finding 9), read as PyTorch's
tools read them (standard library only).

    test_snapshot_utf8.py TEST_SNAPSHOT_FILES_EXE

Runs `test_snapshot_files utf8 DIR`: frames from the history callback hold surrogates
(U+D800..U+DFFF in UTF-8), overlong forms, code points past U+10FFFF, a sequence cut short and
lone continuation bytes. The pickle must load with pickle.load and every string in it must be
strict UTF-8 (pickle itself lets surrogates through: 'surrogatepass'); the JSON must load with
json.load from a file opened with strict UTF-8 decoding. Valid multi-byte characters are kept.
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile

VALID = "valid-\u20ac-\U0001f600-\U0010ffff-\ud7ff-\ue000"


def strings(o):
    if isinstance(o, str):
        yield o
    elif isinstance(o, dict):
        for k, v in o.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(o, (list, tuple)):
        for v in o:
            yield from strings(v)


def frame_strings(d):
    out = set()
    for seg in d["segments"]:
        for b in seg["blocks"]:
            for f in b["frames"]:
                out.add(f["filename"])
                out.add(f["name"])
    return out


def check(d, what):
    for s in strings(d):
        try:
            s.encode("utf-8")  # strict: a lone surrogate raises
        except UnicodeEncodeError as e:
            raise AssertionError("%s: %r is not valid UTF-8: %s" % (what, s, e))
    names = frame_strings(d)
    assert VALID in names, "%s: the valid frame string was not kept: %r" % (what, sorted(names))
    for prefix in ("surrogate-", "overlong-", "beyond-", "truncated-", "lone-"):
        hits = [n for n in names if n.startswith(prefix)]
        assert hits, "%s: no frame string starting %r: %r" % (what, prefix, sorted(names))
        for n in hits:
            assert "?" in n, "%s: %r: the invalid bytes were not replaced" % (what, n)
            assert all(ord(c) < 0x80 for c in n), "%s: %r kept a non-ASCII character" % (what, n)


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="xseg-utf8-") as tmp:
        r = subprocess.run([exe, "utf8", tmp])
        if r.returncode == 77:
            print("SKIP: no device")
            return 77
        assert r.returncode == 0, "%s utf8 %s failed: %d" % (exe, tmp, r.returncode)
        with open(os.path.join(tmp, "utf8.pickle"), "rb") as f:
            d = pickle.load(f)
        check(d, "utf8.pickle")
        with open(os.path.join(tmp, "utf8.json"), encoding="utf-8", errors="strict") as f:
            j = json.load(f)
        check(j, "utf8.json")
    print("ok: the pickle and the JSON load, every string strict UTF-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
