"""xseg.torch.enable() under real PyTorch: runs only where a CUDA build of PyTorch and a GPU are
present (the adapter compiles against PyTorch's C++ headers); skipped with the reason elsewhere."""
import os
import subprocess
import sys
import textwrap

import pytest

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


def torch_reason():
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if torch.version.cuda is None:
        return "this PyTorch has no CUDA support"
    if not torch.cuda.is_available():
        return "no CUDA device (the adapter runs against the real driver, not cudaemu)"
    return None


pytestmark = pytest.mark.skipif(torch_reason() is not None, reason=str(torch_reason()))

SCRIPT = """
import torch, xseg, xseg.torch
xseg.torch.enable()
assert xseg.torch.is_enabled()
dev = torch.device("cuda", 0)
side = torch.cuda.Stream()
torch.manual_seed(0)
w = torch.randn(1024, 1024, device=dev)
outs = []
for step in range(20):
    x = torch.randn(256, 1024, device=dev)
    with torch.cuda.stream(side):
        side.wait_stream(torch.cuda.current_stream())
        y = x @ w
    y.record_stream(torch.cuda.current_stream())
    x.record_stream(side)
    torch.cuda.current_stream().wait_stream(side)
    outs.append((y * 2).sum().item())
    del x, y
stats = torch.cuda.memory_stats()
assert stats["allocation.all.allocated"] > 0, stats
assert stats == {k: v for k, v in stats.items()}
assert "memory summary" in torch.cuda.memory_summary() or "Allocated" in torch.cuda.memory_summary()
snap = torch.cuda.memory._snapshot()
assert snap["segments"], snap
torch.cuda.reset_peak_memory_stats()
torch.cuda.empty_cache()
# graph capture and replay through the allocate-to-pool hooks
static_in = torch.randn(64, 1024, device=dev)
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    static_out = static_in @ w
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    static_out = static_in @ w
for _ in range(3):
    static_in.copy_(torch.randn(64, 1024, device=dev))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, static_in @ w)
print("OK", sum(outs))
"""


def test_enable_under_training_loop_and_graphs():
    env = dict(os.environ, PYTHONPATH=PKG)
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout
    assert "xseg: warning" not in r.stderr
