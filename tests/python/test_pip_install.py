"""`pip install .` (meson-python) builds libxseg and bundles it, with xseg-replay and cudaemu: the
installed package finds the library beside itself, with no XSEG_LIBRARY, and `python -m
xseg.replay` runs the main job on the emulator it carries. Offline, into a fresh venv, with Debian's
python3-mesonpy and pip."""
import ctypes
import importlib.util
import os
import re
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


def _venv(tmp_path):
    """A fresh venv that sees this Python's packages (Debian's meson-python): no network needed."""
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip("no venv for %s (Debian: python3-venv): %s" % (sys.executable, r.stderr.strip()[-300:]))
    return venv


@pytest.mark.skipif(reason() is not None, reason=str(reason()))
def test_pip_install_bundles_the_library(tmp_path):
    """`pip install .` into a fresh venv: the package finds the libxseg bundled with it, and
    `python -m xseg.replay` (and the xseg-replay script) replays a bundled workload through the
    emulator the wheel carries: pip install and one command answer a snapshot on a laptop."""
    venv = _venv(tmp_path)
    python = str(venv / "bin" / "python")
    # README's command, -v included: pip alone shows a spinner for the build's minute or two, -v
    # passes meson's and ninja's progress through ("[12/180] Compiling C object ...").
    r = subprocess.run([python, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps",
                        "--no-index", "--disable-pip-version-check", ROOT],
                       capture_output=True, text=True, timeout=900, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"^\s*\[\d+/\d+\] ", r.stdout + r.stderr, re.M), "no build progress: " + r.stdout[-2000:]
    r = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                       capture_output=True, text=True, timeout=60)
    target = r.stdout.strip()
    assert target.startswith(str(venv)), target
    # Nothing of the build tree or the test environment: the installed package on its own.
    env = {k: v for k, v in os.environ.items()
           if k not in ("XSEG_LIBRARY", "PYTHONPATH", "XSEG_LIBCUDA", "XSEG_SNAPSHOT2TRACE", "XSEG_REPLAY")}
    code = ("import xseg, xseg.compat.torch_memory_saver, xseg.compat.vllm; p = xseg.malloc(1 << 20); xseg.free(p); "
            "print(xseg.library_path()); print(xseg.__file__)")
    emu = dict(env, XSEG_LIBCUDA=os.path.join(target, "xseg", "libcudaemu.so"))
    r = subprocess.run([python, "-c", code], env=emu, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lib, pkg = r.stdout.split()
    assert lib.startswith(target) and pkg.startswith(target), r.stdout
    assert os.path.isfile(os.path.join(os.path.dirname(pkg), "xseg.h"))
    # The version pip recorded is the header's, and the installed package says the same without
    # loading the library (meson wrote it into xseg/_version.py).
    meta = [d for d in os.listdir(target) if d.startswith("xseg-") and d.endswith(".dist-info")]
    import xseg
    assert meta == ["xseg-%s.dist-info" % xseg.version()], meta
    code = ("import xseg; print(xseg.__version__); "
            "print(xseg._lib._lib is None)")
    r = subprocess.run([python, "-c", code], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [xseg.version(), "True"], r.stdout
    # The wheel carries the shared library, the package, and in it xseg-replay, its converter
    # and cudaemu; nothing of the C developer's or the test tooling's (pyproject.toml: -Dwheel=true).
    names = sorted(os.path.relpath(os.path.join(d, f), target)
                   for d, _, files in os.walk(target) for f in files
                   if os.path.relpath(d, target).split(os.sep)[0] in ("xseg", ".xseg.mesonpy.libs"))
    libs = [n for n in names if os.path.basename(n).startswith("libxseg.so")]
    assert libs, names
    unwanted = [n for n in names if n.endswith((".a", ".pc")) or "xseg-top" in n]
    assert not unwanted, unwanted
    assert sorted(n for n in names if n.startswith("xseg" + os.sep) and "__pycache__" not in n) == sorted([
        os.path.join("xseg", f) for f in ("__init__.py", "_lib.py", "_torch_adapter.cpp", "_version.py",
                                          "cupy.py", "ipc.py", "libcudaemu.so", "registry.py", "replay.py",
                                          "torch.py", "xseg-replay", "xseg-snapshot2trace", "xseg.h",
                                          "xseg_torch.h")] + [
        os.path.join("xseg", "compat", f) for f in ("__init__.py", "_backend.py", "torch_memory_saver.py", "vllm.py",
                                                    "vllm_kv.py")])
    # README's Python snippet as printed, in the fresh venv with nothing naming a driver: where no
    # driver loads, the package runs on the emulator the wheel carries and says so in one line.
    snippet = re.search(r"<!-- test: python[^>]*-->\n```python\n(.*?)```",
                        open(os.path.join(ROOT, "README.md")).read(), re.S).group(1)
    r = subprocess.run([python, "-c", snippet], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        note = "xseg: no GPU driver (libcuda.so.1) loads here: running on the emulator this package carries (%s;" % (
            os.path.join(target, "xseg", "libcudaemu.so"))
        assert r.stderr.startswith(note) and r.stderr.count("\n") == 1, r.stderr
    # The main job from pip: no driver on this machine but the emulator in the wheel, found by
    # xseg-replay itself (XSEG_LIBCUDA unset), and the headline of a bundled workload.
    r = subprocess.run([python, "-m", "xseg.replay", "--no-progress", "--marks=none", "--compare",
                        "builtin:inference"], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "using the emulator (cudaemu: %s)" % os.path.join(target, "xseg", "libcudaemu.so") in r.stderr, r.stderr
    assert "== builtin:inference\nSmallest device: xseg " in r.stdout, r.stdout[:3000]
    assert "by default (classic)" in r.stdout, r.stdout[:3000]
    # The console script is the same command.
    r = subprocess.run([str(venv / "bin" / "xseg-replay"), "--list"], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "builtin:training" in r.stdout, r.stdout + r.stderr


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
