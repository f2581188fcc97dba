"""Which driver xseg-replay runs on, for the replay tests: on a real one (a GPU, or cudaemu's
driver-only build) what needs emulated devices of a given size (the verdict's smallest-device
search, --tune, --min-device, --device-mem) is refused, and the tests of it skip with NEEDS_EMU."""
import os
import subprocess
import tempfile

NEEDS_EMU = ("needs cudaemu: the smallest-device search, --tune, --min-device and --device-mem replay on "
             "emulated devices (a real driver here)")


def emulated(replay):
    """Does @p replay run on cudaemu? A replay's JSON summary has the emulator's call counts."""
    fd, path = tempfile.mkstemp(suffix=".trace")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("alloc a 1MiB\n")
        p = subprocess.run([replay, "--marks=none", "--summary=json", path], capture_output=True, text=True,
                           timeout=120)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        raise SystemExit("xseg-replay does not run: %s" % p.stderr)
    return '"driver_calls": null' not in p.stdout
