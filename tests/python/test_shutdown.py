"""xseg.shutdown(): everything back to the driver, the configuration back to its defaults, and
the package usable again after it."""
import pytest

MiB = 1 << 20


def test_shutdown_gives_everything_back(xseg):
    start = xseg.get_config()
    xseg.set_config("expandable_segments:True,idle_release_ms:50,idle_release_thread:True")
    xseg.record_memory_history(enabled="all", stacks="python")
    seen = []
    xseg.attach_oom_observer(lambda *a: seen.append(a))
    ps = [xseg.malloc(n) for n in (4096, 3 * MiB, 600 * 1024, 5 * MiB)]
    xseg.free(ps.pop())
    assert xseg.memory_allocated(0) > 0 and xseg.memory_reserved(0) > 0
    xseg.shutdown()  # the live blocks in ps are freed with the rest
    assert xseg.get_config() == start
    assert xseg.memory_allocated(0) == 0
    assert xseg.memory_reserved(0) == 0
    assert xseg.memory_stats(0)["num_device_alloc"] == 0
    assert xseg.memory_snapshot() == []
    # Usable again, and a second shutdown works as the first.
    p = xseg.malloc(MiB)
    assert xseg.memory_allocated(0) >= MiB
    xseg.shutdown()
    assert xseg.memory_reserved(0) == 0
    xseg.free(xseg.malloc(MiB))


def test_shutdown_refuses_while_a_pool_sleeps(xseg):
    xseg.set_config("expandable_segments:True")
    p = xseg.malloc(3 * MiB)
    xseg.sleep()
    with pytest.raises(xseg.XsegError) as ei:
        xseg.shutdown()
    assert ei.value.status_name == "XSEG_ERROR_ILLEGAL_STATE"
    assert "wake" in str(ei.value)
    xseg.wake()
    assert xseg.memory_allocated(0) >= 3 * MiB  # nothing changed
    xseg.free(p)
    xseg.shutdown()


RELOAD_SCRIPT = r"""
import gc, importlib, sys
import xseg
MiB = 1 << 20
seen = []
xseg.set_config("expandable_segments:True")
xseg.record_memory_history(enabled="all", stacks="python")
xseg.attach_oom_observer(lambda *a: seen.append(a))
ps = [xseg.malloc(n) for n in (4096, 3 * MiB, 5 * MiB)]
xseg.shutdown()
# The reload drops the old module's callbacks (ctypes trampolines): after the shutdown the
# library must call none of them again.
xseg = importlib.reload(xseg)
gc.collect()
assert xseg.memory_allocated(0) == 0 and xseg.memory_reserved(0) == 0
try:
    xseg.malloc(1 << 60)  # an OOM: observers run, none is attached
except xseg.XsegError as e:
    assert e.status_name == "XSEG_ERROR_OUT_OF_MEMORY", e.status_name
else:
    sys.exit("no OOM")
assert not seen
got = []
xseg.attach_oom_observer(lambda *a: got.append(a))
xseg.record_memory_history(enabled="all", stacks="python")
p = xseg.malloc(MiB)
snap = xseg.memory_snapshot()
assert any(b["size"] >= MiB for s in snap for b in s["blocks"]), snap
try:
    xseg.malloc(1 << 60)
except xseg.XsegError:
    pass
assert len(got) == 1, got
xseg.shutdown()
print("reloaded")
"""


def test_reload_after_shutdown():
    """A Python reload after xseg.shutdown(): the old module's callbacks are never called again,
    and the reloaded package works, with history and observers of its own."""
    import os
    import subprocess
    import sys
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.path.join(here, "..", "..", "python") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", RELOAD_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reloaded" in r.stdout
