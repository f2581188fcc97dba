#!/usr/bin/env python3
"""Unpack Debian packages into a private prefix without dpkg or root (the GPU image may lack
both): the data member of each .deb (an ar archive) is extracted under DEST, which then holds
DEST/usr/lib/..., DEST/usr/bin/... . Nothing is installed; symlinks inside stay relative to DEST.

usage: unpack_deb.py DEST PKG.deb...
"""
import io
import os
import sys
import tarfile


def members(path):
    """The (name, bytes) members of the ar archive at path."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError("%s: not a .deb (no ar header)" % path)
        while True:
            hdr = f.read(60)
            if len(hdr) < 60:
                return
            name = hdr[:16].decode().strip().rstrip("/")
            size = int(hdr[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def unpack(deb, dest):
    for name, data in members(deb):
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise ValueError("%s: zstd data member: Python's tarfile cannot read it" % deb)
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                for m in tar.getmembers():
                    # Package paths only: no absolute names, no climbing out of DEST.
                    if m.name.startswith("/") or ".." in m.name.split("/"):
                        raise ValueError("%s: unsafe path %s" % (deb, m.name))
                    if m.islnk() or m.issym():
                        if m.islnk() and (m.linkname.startswith("/") or ".." in m.linkname.split("/")):
                            raise ValueError("%s: unsafe link %s" % (deb, m.name))
                tar.extractall(dest)
            return
    raise ValueError("%s: no data.tar member" % deb)


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    dest = argv[0]
    os.makedirs(dest, exist_ok=True)
    for deb in argv[1:]:
        unpack(deb, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
