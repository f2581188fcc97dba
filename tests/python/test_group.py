"""Memory groups from Python: xseg.group_members() (config key memory_group)."""
import json
import os
import subprocess
import sys
import time

import pytest

MiB = 1 << 20

# A fresh process with a group (the configuration is read once per process): its own cudaemu
# share, so its device and its group table are its own.
CHILD = r"""
import json, os, sys
import xseg
p = xseg.malloc(40 << 20, 0)
print(json.dumps(xseg.group_members(0)))
xseg.free(p)
xseg.shutdown()
"""


def test_group_members_lists_this_process():
    if not os.environ.get("XSEG_LIBCUDA"):
        pytest.skip("needs cudaemu (CUDAEMU_SHARED)")
    # A name no earlier process used: a file a killed run left in /dev/shm is never met again.
    share = "py%d.%x" % (os.getpid(), time.monotonic_ns())
    env = dict(os.environ, XSEG_ALLOC_CONF="memory_group:py", CUDAEMU_SHARED=share,
               CUDAEMU_TOTAL_MEM="1G")
    pkg = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    env["PYTHONPATH"] = os.path.abspath(pkg) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    members = json.loads(out.stdout)
    assert len(members) == 1
    (m,) = members
    assert m["pid"] > 0 and m["pid"] != os.getpid()
    assert set(m) == {"pid", "reserved_bytes", "allocated_bytes", "reclaimable_bytes",
                      "budget_bytes", "gave_way_count", "gave_way_bytes", "asked_count"}


def test_group_members_without_group_raises(xseg):
    with pytest.raises(xseg.XsegError, match="is in no memory group"):
        xseg.group_members(0)
