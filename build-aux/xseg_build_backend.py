"""pip's build backend for xseg (pyproject.toml: build-backend, backend-path): meson-python's hooks,
unchanged, where meson-python can be imported; where it cannot (pip install --no-build-isolation
without it), one line that says which package to install instead of pip's traceback."""
import sys

try:
    import mesonpy as _backend
except ImportError as e:
    if getattr(e, "name", None) != "mesonpy":  # meson-python is there but broken: its own error
        raise
    sys.stderr.write(
        "xseg: building needs meson-python, which %s cannot import: install it "
        "(Debian/Ubuntu: apt install python3-mesonpy; elsewhere: pip install meson-python), "
        "or run pip without --no-build-isolation to let it fetch meson-python\n" % sys.executable)
    raise SystemExit(1)


def __getattr__(name):
    # Every PEP 517/660 hook this meson-python has, and only those (pip probes optional hooks).
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_backend, name)
