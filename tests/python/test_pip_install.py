"""`pip install .` (meson-python) builds libxseg and bundles it: the installed package finds the
library beside itself, with no XSEG_LIBRARY. Offline, with Debian's python3-mesonpy and pip."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def reason():
    if importlib.util.find_spec("pip") is None:
        return "pip is not installed for %s (Debian: python3-pip)" % sys.executable
    if importlib.util.find_spec("mesonpy") is None:
        return "meson-python is not installed (Debian: python3-mesonpy)"
    return None


@pytest.mark.skipif(reason() is not None, reason=str(reason()))
def test_pip_install_bundles_the_library(tmp_path):
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--no-index", "--disable-pip-version-check", "--target", str(target), ROOT],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("XSEG_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    if env.get("XSEG_LIBCUDA"):
        env["XSEG_LIBCUDA"] = os.path.abspath(env["XSEG_LIBCUDA"])
    code = ("import xseg; p = xseg.malloc(1 << 20); xseg.free(p); "
            "print(xseg.library_path()); print(xseg.__file__)")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lib, pkg = r.stdout.split()
    assert lib.startswith(str(target)) and pkg.startswith(str(target)), r.stdout
    assert os.path.isfile(os.path.join(os.path.dirname(pkg), "xseg.h"))
    # The version pip recorded is the header's, and the installed package says the same without
    # loading the library (meson wrote it into xseg/_version.py).
    meta = [d for d in os.listdir(target) if d.endswith(".dist-info")]
    import xseg
    assert meta == ["xseg-%s.dist-info" % xseg.version()], meta
    code = ("import xseg; print(xseg.__version__); "
            "print(xseg._lib._lib is None)")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [xseg.version(), "True"], r.stdout
    # The wheel carries the shared library and the package, nothing of the C developer's or the
    # test tooling's (pyproject.toml: -Dwheel=true).
    names = sorted(os.path.relpath(os.path.join(d, f), target)
                   for d, _, files in os.walk(target) for f in files)
    libs = [n for n in names if os.path.basename(n).startswith("libxseg.so")]
    assert libs, names
    unwanted = [n for n in names
                if n.endswith((".a", ".pc")) or "cudaemu" in n or "xseg-replay" in n
                or "snapshot2trace" in n or n.startswith(("include", "bin", "lib"))]
    assert not unwanted, unwanted
    assert sorted(n for n in names if n.startswith("xseg" + os.sep) and "__pycache__" not in n) == [
        os.path.join("xseg", f) for f in ("__init__.py", "_lib.py", "_torch_adapter.cpp", "_version.py",
                                          "cupy.py", "ipc.py", "registry.py", "torch.py", "xseg.h", "xseg_torch.h")]


@pytest.mark.skipif(importlib.util.find_spec("pip") is None,
                    reason="pip is not installed for %s (Debian: python3-pip)" % sys.executable)
def test_pip_install_without_mesonpy_says_which_package(tmp_path):
    # meson-python hidden from the backend pip runs (--no-build-isolation uses this Python): a
    # `mesonpy` on PYTHONPATH that fails to import as a missing module does.
    fake = tmp_path / "hide" / "mesonpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'mesonpy'\", name='mesonpy')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "hide")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--no-index", "--disable-pip-version-check", "--target",
                        str(tmp_path / "site"), ROOT],
                       env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    lines = [l for l in out.splitlines() if "xseg: building needs meson-python" in l]
    assert len(lines) == 1 and "python3-mesonpy" in lines[0], out
    assert "Traceback" not in out and "BackendUnavailable" not in out, out
    # With meson-python importable, the same backend is meson-python's own hooks.
    r = subprocess.run([sys.executable, "-c",
                        "import sys; sys.path.insert(0, sys.argv[1]); import xseg_build_backend as b; "
                        "import mesonpy; print(b.build_wheel is mesonpy.build_wheel)",
                        os.path.join(ROOT, "build-aux")], capture_output=True, text=True, timeout=60)
    if importlib.util.find_spec("mesonpy") is not None:
        assert r.returncode == 0 and r.stdout.strip() == "True", r.stdout + r.stderr
