"""xseg-replay from Python: `python -m xseg.replay [ARGS]` (or the `xseg-replay` console script a
pip install puts on PATH) runs the xseg-replay of this package's own installation with ARGS, as
the command line would: `python -m xseg.replay FILE.pickle` answers a PyTorch snapshot (the
smallest device for xseg and for PyTorch's allocator by default and with its best one-line
setting; for an OOM, whether xseg would have avoided it), with no arguments it replays the bundled
workloads. Where no GPU driver loads, it runs on cudaemu, the emulated driver the wheel carries
beside it: `pip install` and one command answer a snapshot on a laptop. `--help` lists the rest.

The executable is looked for beside this module (a wheel: pip install .), then in the bindir
`meson install` recorded (_version.py), then on PATH; $XSEG_REPLAY names another.
"""
import os
import shutil
import sys

__all__ = ["executable", "main"]

_NAME = "xseg-replay"


def _candidates():
    env = os.environ.get("XSEG_REPLAY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, _NAME)
    try:
        from ._version import bindir
    except ImportError:  # the source tree, or a package from before bindir was recorded
        bindir = ""
    if bindir:
        yield os.path.normpath(os.path.join(here, bindir, _NAME))
    found = shutil.which(_NAME)
    # The console script of the same name is this module again, not the executable.
    if found and not _is_script(found):
        yield found


def _is_script(path):
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def executable():
    """The path of the xseg-replay this package runs. Raises FileNotFoundError naming where it
    looked when there is none."""
    tried = []
    for cand in _candidates():
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
        tried.append(cand)
    raise FileNotFoundError("xseg: no xseg-replay executable (looked at %s): install the package with pip "
                            "(pip install --no-build-isolation .), or build it (tools/replay.sh), or set "
                            "XSEG_REPLAY to its path" % (", ".join(tried) or "nothing"))


def main(argv=None):
    """Run xseg-replay with @p argv (default: the command line's arguments); returns its exit
    status (the process is replaced by it when run as a program)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        exe = executable()
    except FileNotFoundError as e:
        sys.stderr.write("%s\n" % e)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    if argv is None:
        os.execv(exe, [exe] + args)  # signals and the exit status are xseg-replay's own
    import subprocess
    return subprocess.call([exe] + args)


if __name__ == "__main__":
    sys.exit(main())
