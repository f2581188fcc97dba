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
import ctypes, json, os, sys
import xseg
p = xseg.malloc(40 << 20, 0)
# 64 MiB outside xseg (as a library's cudaMalloc), then a growth: xseg measures its foreign bytes.
lib = ctypes.CDLL(os.environ["XSEG_LIBCUDA"])
dp = ctypes.c_uint64(0)
assert lib.cuMemAlloc_v2(ctypes.byref(dp), ctypes.c_size_t(64 << 20)) == 0
q = xseg.malloc(100 << 20, 0)
xseg.free(q)
print(json.dumps(xseg.group_members(0)))
xseg.free(p)
xseg.shutdown()
"""


def test_group_members_lists_this_process():
    if not os.environ.get("XSEG_LIBCUDA"):
        pytest.skip("needs cudaemu (CUDAEMU_SHARED)")
    # A name no earlier process used: a file a killed run left in /dev/shm is never met again.
    share = "py%d.%x" % (os.getpid(), time.monotonic_ns())
    env = dict(os.environ, XSEG_ALLOC_CONF="memory_group:py,memory_budget_mb:512,memory_group_budget_mb:900",
               CUDAEMU_SHARED=share,
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
    assert set(m) == {"pid", "ask_timeouts", "reserved_bytes", "allocated_bytes", "reclaimable_bytes",
                      "budget_bytes", "gave_way_count", "gave_way_bytes", "asked_count",
                      "foreign_bytes", "group_budget_bytes"}
    assert m["ask_timeouts"] == 0
    assert m["foreign_bytes"] == 64 * MiB
    assert m["budget_bytes"] == 512 * MiB and m["group_budget_bytes"] == 900 * MiB


def test_group_members_without_group_raises(xseg):
    with pytest.raises(xseg.XsegError, match="is in no memory group"):
        xseg.group_members(0)
