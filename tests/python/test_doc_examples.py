"""Every tagged example of README.md, docs/guide.md, docs/troubleshooting.md and docs/registrations.md runs: the fenced block after a line
`<!-- test: KIND [OPTIONS] -->` is extracted and run in a scratch folder, so the docs never drift
from what the package, the library and the tools do.

KIND:
  python [snapshot=FILE]  the package over the libxseg under test (cudaemu in the plain suite);
                          with snapshot=FILE, FILE must be a snapshot the viewer draws (blocks
                          and trace events, with frames)
  sh [output]             shell commands (`build/` and `tools/` reach the build and source trees);
                          with `output`, the next fenced block is their stdout, digit for digit
                          (the `host time` line, a wall-clock figure, aside)
  c                       a C program built against include/xseg.h and the libxseg under test
  torch [needs=MOD,...]   Python that needs a CUDA PyTorch and a GPU (and MODs): skipped with the
                          reason elsewhere; run by the GPU acceptance run
  cupy                    Python that needs CuPy and a GPU
  gpu                     shell commands for a GPU machine: run only with XSEG_GUIDE_GPU=1 (the
                          GPU acceptance run), skipped with the reason elsewhere
Blocks needing a real device run on the real driver (XSEG_LIBCUDA is dropped for them).
"""
import importlib.util
import os
import pickle
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DOCS = ["README.md", os.path.join("docs", "guide.md"), os.path.join("docs", "troubleshooting.md"),
        os.path.join("docs", "registrations.md")]
TAG = re.compile(r"^<!-- test: (\w+)((?: [^ ]+)*) -->$")


def blocks():
    """(doc, line, kind, options, code, expected output or None) for every tagged block."""
    out = []
    for doc in DOCS:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            lines = f.read().split("\n")
        fences = []  # (start line index, code) of every fenced block
        i = 0
        while i < len(lines):
            if lines[i].startswith("```"):
                j = i + 1
                while j < len(lines) and not lines[j].startswith("```"):
                    j += 1
                fences.append((i, "\n".join(lines[i + 1:j]) + "\n"))
                i = j
            i += 1
        for n, line in enumerate(lines):
            m = TAG.match(line)
            if not m:
                continue
            following = [k for k, (start, _) in enumerate(fences) if start > n]
            assert following and fences[following[0]][0] == n + 1, \
                "%s:%d: a test tag must be followed by a fenced block" % (doc, n + 1)
            k = following[0]
            opts = m.group(2).split()
            expected = fences[k + 1][1] if "output" in opts else None
            out.append((doc, n + 1, m.group(1), opts, fences[k][1], expected))
    return out


BLOCKS = blocks()


def _device_reason(kind, opts):
    needs = [o.split("=", 1)[1].split(",") for o in opts if o.startswith("needs=")]
    for mod in sum(needs, []):
        if importlib.util.find_spec(mod) is None:
            return "needs %s (not installed); GPU acceptance run" % mod
    if kind == "torch":
        try:
            import torch
        except ImportError:
            return "needs a CUDA PyTorch (not installed); GPU acceptance run"
        if torch.version.cuda is None or not torch.cuda.is_available():
            return "needs a CUDA PyTorch and a GPU; GPU acceptance run"
    if kind == "cupy":
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()
        except Exception as e:
            return "needs CuPy and a GPU (%s); GPU acceptance run" % type(e).__name__
    if kind == "gpu" and os.environ.get("XSEG_GUIDE_GPU") != "1":
        return "shell commands for a GPU machine: run with XSEG_GUIDE_GPU=1 (GPU acceptance run)"
    return None


def _env(real_device):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    if real_device:
        env.pop("XSEG_LIBCUDA", None)
    env.pop("XSEG_GUIDE_GPU", None)  # a gpu block that runs the test suite must not run itself again
    return env


def _scratch(tmp_path):
    build = os.environ.get("XSEG_BUILD_ROOT")
    if build:
        os.symlink(build, tmp_path / "build")
    os.symlink(os.path.join(ROOT, "tools"), tmp_path / "tools")
    return str(tmp_path)


def check_snapshot(path):
    """What PyTorch's viewer needs to draw something: segments with blocks that carry frames,
    and trace events (the timeline) with frames."""
    with open(path, "rb") as f:
        snap = pickle.load(f)
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert blocks and all(b["frames"] for b in blocks), snap["segments"]
    events = [e for dev in snap["device_traces"] for e in dev if e["action"] == "alloc"]
    assert events and all(e["frames"] for e in events), snap["device_traces"]


@pytest.mark.parametrize("doc,line,kind,opts,code,expected", BLOCKS,
                         ids=["%s:%d-%s" % (b[0], b[1], b[2]) for b in BLOCKS])
def test_doc_example(doc, line, kind, opts, code, expected, tmp_path):
    assert kind in ("python", "sh", "c", "torch", "cupy", "gpu"), "%s:%d: kind %r" % (doc, line, kind)
    # Even a block that cannot run here must parse (Python, or sh -n).
    if kind in ("python", "torch", "cupy"):
        compile(code, "%s:%d" % (doc, line), "exec")
    elif kind in ("sh", "gpu"):
        r = subprocess.run(["sh", "-n", "-c", code], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, "%s:%d: %s" % (doc, line, r.stderr)
    reason = _device_reason(kind, opts)
    if reason:
        pytest.skip(reason)
    real = kind in ("torch", "cupy", "gpu")
    cwd = _scratch(tmp_path)
    where = "%s:%d (%s block)" % (doc, line, kind)
    if kind in ("python", "torch", "cupy"):
        cmd = [sys.executable, "-c", code]
    elif kind in ("sh", "gpu"):
        cmd = ["sh", "-ec", code]
        if kind == "gpu":
            cwd = ROOT  # commands that set up builds of the tree run in it
    else:
        build = os.environ.get("XSEG_BUILD_ROOT")
        if not build:
            pytest.skip("XSEG_BUILD_ROOT (the meson build folder) is not set")
        (tmp_path / "example.c").write_text(code)
        exe = str(tmp_path / "example")
        r = subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror",
                            "-I", os.path.join(ROOT, "include"), "-o", exe, "example.c",
                            "-L", build, "-lxseg", "-Wl,-rpath," + build],
                           cwd=cwd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, "%s does not compile:\n%s" % (where, r.stderr)
        cmd = [exe]
    # A gpu block builds the tree and runs the whole suite on the real driver: up to an hour.
    r = subprocess.run(cmd, cwd=cwd, env=_env(real), capture_output=True, text=True,
                       timeout=3600 if kind == "gpu" else 300)
    assert r.returncode == 0, "%s failed:\n%s\n%s" % (where, r.stdout[-3000:], r.stderr[-3000:])
    for o in opts:
        if o.startswith("snapshot="):
            check_snapshot(os.path.join(cwd, o.split("=", 1)[1]))
    if expected is not None:
        def keep(text):
            return [l.rstrip() for l in text.strip("\n").split("\n") if not l.strip().startswith("host time")]
        assert keep(r.stdout) == keep(expected), "%s prints other figures than the docs show:\n%s" % (where, r.stdout)


def test_docs_have_tagged_examples():
    # The collection itself: README's Python snippet and the guide's blocks are found.
    kinds = {(b[0], b[2]) for b in BLOCKS}
    assert ("README.md", "python") in kinds, kinds
    assert {k for d, k in kinds if d.endswith("guide.md")} >= {"python", "sh", "c", "torch", "gpu"}, kinds
