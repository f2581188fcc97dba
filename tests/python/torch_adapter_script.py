"""Run by test_torch_adapter.py in a fresh process: torch_adapter_script.py MODE OUTDIR.

MODE "native": PyTorch's own allocator; "xseg": xseg.torch.enable() first. Both train the same
small model deterministically and save the losses and parameters to OUTDIR/train.pt. The xseg
run then makes each check in CHECKS and writes OUTDIR/report.json: {check: "ok" | "skip: why" |
"fail: traceback"} (plus "allocator": the allocator's name).
"""
import json
import os
import pickle
import sys
import traceback

import torch
import torch.nn.functional as F

mode, out = sys.argv[1], sys.argv[2]
if mode == "xseg":
    import xseg
    import xseg.torch
    xseg.torch.enable()
    assert xseg.torch.is_enabled()

torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cudnn.benchmark = False
dev = torch.device("cuda", 0)
MiB = 1 << 20


def train():
    """SGD with momentum on a small MLP. Batches are copied host-to-device on a copy stream
    (prefetch, record_stream on the compute stream); gradients are averaged with a copy of
    themselves on a communication stream (as DDP's bucketed reduction runs on its own stream),
    each temporary freed while that stream still works on it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(128, 256, generator=g).pin_memory() for _ in range(6)]
    ys = [torch.randint(0, 10, (128,), generator=g).pin_memory() for _ in range(6)]
    main = torch.cuda.current_stream()
    copy, comm = torch.cuda.Stream(), torch.cuda.Stream()

    def prefetch(i):
        with torch.cuda.stream(copy):
            return xs[i].to(dev, non_blocking=True), ys[i].to(dev, non_blocking=True)

    steps = 24
    losses = []
    nxt = prefetch(0)
    for step in range(steps):
        main.wait_stream(copy)
        x, y = nxt
        x.record_stream(main)
        y.record_stream(main)
        if step + 1 < steps:
            nxt = prefetch((step + 1) % len(xs))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        comm.wait_stream(main)
        with torch.cuda.stream(comm):
            for p in model.parameters():
                buf = p.grad.clone()  # allocated on the communication stream
                buf.mul_(0.5).add_(p.grad, alpha=0.5)
                p.grad.copy_(buf)
                p.grad.record_stream(comm)
                del buf
        main.wait_stream(comm)
        opt.step()
        losses.append(loss.detach())
        del x, y, loss
    torch.cuda.synchronize()
    torch.save({"losses": torch.stack(losses).cpu(), "params": [p.detach().cpu() for p in model.parameters()]},
               os.path.join(out, "train.pt"))
    return model


def check_stats():
    keep = torch.empty(3 * MiB, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats(dev)
    x = xseg.memory_stats(0)
    common = set(s) & set(x)
    assert "allocated_bytes.all.current" in common and len(common) >= 100, sorted(set(s) ^ set(x))
    for k in sorted(common):
        assert s[k] == x[k], (k, s[k], x[k])
    assert torch.cuda.memory_allocated(dev) == x["allocated_bytes.all.current"] >= 3 * MiB
    assert torch.cuda.memory_reserved(dev) == x["reserved_bytes.all.current"]
    text = torch.cuda.memory_summary(dev)
    assert "Allocated memory" in text and "GPU reserved memory" in text, text
    del keep


def check_resets():
    a = torch.empty(40 * MiB, dtype=torch.uint8, device=dev)
    del a
    assert torch.cuda.max_memory_allocated(dev) > torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    assert torch.cuda.max_memory_allocated(dev) == torch.cuda.memory_allocated(dev)
    torch.cuda.reset_accumulated_memory_stats(dev)
    s = torch.cuda.memory_stats(dev)
    assert s["allocation.all.allocated"] == 0 and s["allocation.all.freed"] == 0, s
    b = torch.empty(MiB, dtype=torch.uint8, device=dev)
    del b
    assert torch.cuda.memory_stats(dev)["allocation.all.allocated"] == 1
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved(dev) == xseg.memory_reserved(0)


def check_cache_info():
    if not torch.backends.cudnn.is_available():
        return "skip: cuDNN is not available"
    torch.use_deterministic_algorithms(False)  # benchmark mode picks algorithms by timing
    torch.backends.cudnn.benchmark = True
    try:
        conv = torch.nn.Conv2d(16, 32, 3, padding=1).to(dev)
        inp = torch.randn(8, 16, 64, 64, device=dev)
        out_ = conv(inp)  # cuDNN asks the allocator for its largest cached block (cacheInfo)
        torch.cuda.synchronize()
        ref = F.conv2d(inp.cpu(), conv.weight.cpu(), conv.bias.cpu(), padding=1)
        assert torch.allclose(out_.cpu(), ref, atol=1e-3, rtol=1e-3)
    finally:
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)


def pool_of(ptr):
    for seg in xseg.memory_snapshot(0):
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return tuple(seg["segment_pool_id"])
    raise AssertionError("no xseg segment holds %#x" % ptr)


def check_graph(model):
    static_in = torch.randn(64, 256, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = model(static_in)
    assert pool_of(static_out.data_ptr()) != (0, 0)  # captured into a private pool
    for i in range(3):
        torch.manual_seed(10 + i)
        new = torch.randn(64, 256, device=dev)
        static_in.copy_(new)
        g.replay()
        torch.cuda.synchronize()
        # the replay ran the captured kernels on the new input (eager may pick other GEMM kernels)
        assert torch.allclose(static_out, model(new), rtol=1e-4, atol=1e-5)
    del g, static_out
    torch.cuda.empty_cache()
    x = torch.ones(MiB, device=dev)
    assert float(x.sum()) == MiB


def check_mempool():
    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        return "skip: this PyTorch (%s) has no torch.cuda.MemPool / use_mem_pool" % torch.__version__
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    u = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    assert pool_of(t.data_ptr()) == tuple(pool.id), (pool_of(t.data_ptr()), pool.id)
    assert pool_of(u.data_ptr()) == (0, 0)
    if hasattr(pool, "use_count"):
        assert pool.use_count() >= 1
    t.fill_(7)
    torch.cuda.synchronize()
    assert int(t[123]) == 7
    del t, u, pool
    torch.cuda.empty_cache()


def allocate_for_snapshot():
    return torch.empty(5 * MiB, dtype=torch.uint8, device=dev)


def check_snapshot():
    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        t = allocate_for_snapshot()
        path = os.path.join(out, "snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    blocks = [b for seg in snap["segments"] for b in seg["blocks"] if b["address"] == t.data_ptr()]
    assert len(blocks) == 1 and blocks[0]["state"] == "active_allocated", blocks
    here = os.path.abspath(__file__)
    names = [(os.path.abspath(fr["filename"]), fr["name"]) for fr in blocks[0]["frames"]]
    assert (here, "allocate_for_snapshot") in names, names
    events = [e for dev_trace in snap["device_traces"] for e in dev_trace]
    assert any(e["action"] == "alloc" and e["addr"] == t.data_ptr() for e in events)
    segs = torch.cuda.memory_snapshot()
    assert any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segs)
    del t


def check_oom():
    """An allocation xseg cannot serve raises torch.cuda.OutOfMemoryError (PyTorch's pluggable
    wrapper would hand the NULL on as the tensor's data pointer) with xseg's message, which names
    the OOM snapshot; the allocator stays usable."""
    path = os.path.join(out, "oom.pickle")
    xseg.set_oom_snapshot(path)
    before = torch.cuda.memory_stats(dev)["num_ooms"]
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device=dev)  # 1 PiB
    except torch.cuda.OutOfMemoryError as e:
        msg = str(e)
    else:
        raise AssertionError("allocating 1 PiB did not raise torch.cuda.OutOfMemoryError")
    assert "CUDA out of memory. Tried to allocate 1.00 PiB" in msg and path in msg, msg
    assert os.path.getsize(path) > 0
    assert torch.cuda.memory_stats(dev)["num_ooms"] == before + 1
    x = torch.ones(MiB, device=dev)
    assert float(x.sum()) == MiB


report = {}
model = train()
report["allocator"] = torch.cuda.get_allocator_backend()  # the current allocator's name()
if mode == "xseg":
    checks = [("stats", check_stats), ("resets", check_resets), ("cache_info", check_cache_info),
              ("graph", lambda: check_graph(model)), ("mempool", check_mempool), ("snapshot", check_snapshot),
              ("oom", check_oom)]
    for name, fn in checks:
        try:
            r = fn()
            report[name] = r if isinstance(r, str) else "ok"
        except Exception:
            report[name] = "fail: " + traceback.format_exc()
with open(os.path.join(out, "report.json"), "w") as f:
    json.dump(report, f)
print("done", mode)
