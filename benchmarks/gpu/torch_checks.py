#!/usr/bin/env python3
"""Checks of xseg under real PyTorch (run.sh's torch check) and of its services through PyTorch
(its services check), each run on its own so that one failure hides none of the others. Every
check prints one JSON line {"name", "status": "pass"|"fail"|"skip", "reason", "data"}; the exit
status is 0 when the checks ran (failed ones included), so the caller reads the lines.

  torch_checks.py --lib LIBXSEG --out DIR --group torch|services [--quick]
  torch_checks.py --group snapshot-emulator --lib LIBXSEG --out DIR   (no torch: xseg's own
      snapshot writer on whatever driver XSEG_LIBCUDA names; the CI dry run uses it)

Group torch (xseg.torch.enable() first): record_stream of an empty tensor and of foreign memory,
get_per_process_memory_fraction, _cuda_isHistoryEnabled, MemPool.snapshot() of one pool,
torch.accelerator.memory_stats, torch.compile(mode="reduce-overhead") (a straight tree, one that
branches after a graph break, so that cudagraph trees restore a checkpoint of xseg's pool and check
its live blocks, and training steps alternating with eval steps of another shape, each against
eager), torch.cuda.graph
in a private pool, a stale write under graph replay reported (debug_stale_access, fills flushed
by the replay's wrapper), torch.cuda.MemPool, torch.multiprocessing (a CUDA tensor sent to a spawned
process), memory_stats/memory_summary/memory_snapshot through torch.cuda, pinned tensors from
xseg's host cache (PyTorch 2.8+: pointer, stats, non_blocking copies, no reuse under a queued
copy), and a snapshot with
history dumped by torch.cuda.memory._dump_snapshot into DIR/snapshot.pickle, and one in the
stale-access mode with a finding into DIR/stale_snapshot.pickle (also in group snapshot-emulator;
both checked afterwards with ../shared/tools/memory-viz: benchmarks/gpu/check_snapshots.sh); and
"xseg.compat: CASE" for each case of tests/python/compat_torch_script.py (torch_memory_saver's and
vLLM's own tests, ported, over xseg.compat), each in a process of its own.
Group services: sleep/wake of live tensors (GiB/s each way beside the pinned copy rate measured in
the same call, first and kept-backup cycles, the time until a kernel runs again), a CUDA graph
replayed bit-exact after its pool and its weights' pool slept and woke by tag (level 1), trim, and
spill's contract (kernels on a side stream writing spilled, undeclared and taken-back tensors while
another thread promotes; every byte compared).
"""
import argparse
import ctypes
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
MiB = 1 << 20
GiB = 1 << 30


class Skip(Exception):
    pass


def report(name, fn):
    t0 = time.perf_counter()
    try:
        data = fn()
        line = {"name": name, "status": "pass", "reason": "", "data": data}
    except Skip as e:
        line = {"name": name, "status": "skip", "reason": str(e), "data": None}
    except BaseException:  # one check's failure (even SystemExit from a library) hides no other
        line = {"name": name, "status": "fail", "reason": traceback.format_exc()[-3000:], "data": None}
    line["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(line), flush=True)


# --- group torch ---------------------------------------------------------------------------------

# The owner allocators of the MemPool(allocator=...) checks, built with the system compiler at run
# time: one ledger the check reads (owner_stat: 0 allocs, 1 frees, 2 live, 3 failed frees, 4 the
# backend) around each owner's raw_alloc / raw_free and its resolve(), which picks the backend.
OWNER_LEDGER_C = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <sys/types.h>
static int backend = -1;
static long allocs, frees, live, bad;
static void resolve(void);
static int raw_alloc(void **p, size_t size);
static int raw_free(void *p);
void *PREFIX_alloc(ssize_t size, int device, void *stream)
{
    (void)device, (void)stream;
    resolve();
    void *p = 0;
    if (raw_alloc(&p, (size_t)size) || !p)
        return 0;
    allocs++, live++;
    return p;
}
void PREFIX_free(void *ptr, ssize_t size, int device, void *stream)
{
    (void)size, (void)device, (void)stream;
    frees++, live--;
    if (raw_free(ptr))
        bad++;
}
long owner_stat(int k) { return k == 0 ? allocs : k == 1 ? frees : k == 2 ? live : k == 3 ? bad : backend; }
"""

# NCCL's ncclMemAlloc / ncclMemFree (NCCL's allocator.cc) when PyTorch loaded libnccl (backend 1),
# otherwise the driver's cuMemAlloc / cuMemFree in the context PyTorch made current.
OWNER_C = OWNER_LEDGER_C.replace("PREFIX", "owner") + r"""
static int (*nccl_alloc)(void **, size_t);
static int (*nccl_free)(void *);
static int (*cu_alloc)(unsigned long long *, size_t);
static int (*cu_free)(unsigned long long);
static void resolve(void)
{
    if (backend >= 0)
        return;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (h && (nccl_alloc = (int (*)(void **, size_t))dlsym(h, "ncclMemAlloc")) &&
        (nccl_free = (int (*)(void *))dlsym(h, "ncclMemFree"))) {
        backend = 1;
        return;
    }
    h = dlopen("libcuda.so.1", RTLD_NOW);
    cu_alloc = h ? (int (*)(unsigned long long *, size_t))dlsym(h, "cuMemAlloc_v2") : 0;
    cu_free = h ? (int (*)(unsigned long long))dlsym(h, "cuMemFree_v2") : 0;
    backend = 0;
}
static int raw_alloc(void **p, size_t size)
{
    return backend ? nccl_alloc(p, size) : cu_alloc ? cu_alloc((unsigned long long *)p, size) : 1;
}
static int raw_free(void *p) { return backend ? nccl_free(p) : cu_free((unsigned long long)p); }
"""

# Megatron's unified-memory pool (issue 73: megatron/core/inference/unified_memory.py,
# cudaMallocManaged(cudaMemAttachGlobal) / cudaFree): the CUDA runtime PyTorch loaded when one is
# found (backend 1), else the driver's cuMemAllocManaged / cuMemFree in PyTorch's context.
OWNER_MANAGED_C = OWNER_LEDGER_C.replace("PREFIX", "managed") + r"""
static int (*rt_alloc)(void **, size_t, unsigned);
static int (*rt_free)(void *);
static int (*cu_alloc)(unsigned long long *, size_t, unsigned);
static int (*cu_free)(unsigned long long);
static void resolve(void)
{
    static const char *const rt[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    if (backend >= 0)
        return;
    for (int i = 0; i < 3; i++) {
        void *h = dlopen(rt[i], RTLD_NOW | RTLD_NOLOAD);
        if (h && (rt_alloc = (int (*)(void **, size_t, unsigned))dlsym(h, "cudaMallocManaged")) &&
            (rt_free = (int (*)(void *))dlsym(h, "cudaFree"))) {
            backend = 1;
            return;
        }
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    cu_alloc = h ? (int (*)(unsigned long long *, size_t, unsigned))dlsym(h, "cuMemAllocManaged") : 0;
    cu_free = h ? (int (*)(unsigned long long))dlsym(h, "cuMemFree_v2") : 0;
    backend = 0;
}
/* 1: cudaMemAttachGlobal, CU_MEM_ATTACH_GLOBAL */
static int raw_alloc(void **p, size_t size)
{
    return backend ? rt_alloc(p, size, 1) : cu_alloc ? cu_alloc((unsigned long long *)p, size, 1) : 1;
}
static int raw_free(void *p) { return backend ? rt_free(p) : cu_free((unsigned long long)p); }
"""


def build_owner(args, source, name):
    """Compile an owner allocator's C source into a shared object under args.out: its path, or
    Skip when the system compiler cannot."""
    work = tempfile.mkdtemp(prefix="xseg-%s-" % name, dir=args.out)
    src, so = os.path.join(work, name + ".c"), os.path.join(work, name + ".so")
    with open(src, "w") as f:
        f.write(source)
    cc = os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", so, src, "-ldl"], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip("%s could not build the owner allocator: %s" % (cc, r.stderr[-500:]))
    return so


def mp_child(q, r):
    """torch.multiprocessing child (spawned: a fresh interpreter). It installs xseg before its
    first CUDA allocation, as every process of a job must: the handle it receives is xseg's."""
    try:
        import xseg.torch
        xseg.torch.enable()
        t = q.get(timeout=90)
        r.put(("ok", float(t.float().sum()), int(t.device.index)))
        del t
    except BaseException:
        r.put(("fail", traceback.format_exc(), -1))


def torch_checks(args, xseg, torch):
    dev = torch.device("cuda", 0)

    def pool_of(ptr):
        for seg in xseg.memory_snapshot(0):
            if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
                return tuple(seg["segment_pool_id"])
        raise AssertionError("no xseg segment holds %#x" % ptr)

    def allocator():
        name = torch.cuda.get_allocator_backend()
        assert xseg.torch.is_enabled(), "xseg.torch.is_enabled() is False"
        return {"allocator_backend": name, "torch": torch.__version__, "cuda": torch.version.cuda}

    def stats_summary_snapshot():
        x = torch.empty(3 * MiB, dtype=torch.uint8, device=dev)
        s = torch.cuda.memory_stats(dev)
        mine = xseg.memory_stats(0)
        assert s["allocated_bytes.all.current"] == mine["allocated_bytes.all.current"] >= 3 * MiB, \
            (s["allocated_bytes.all.current"], mine["allocated_bytes.all.current"])
        assert torch.cuda.memory_allocated(dev) == s["allocated_bytes.all.current"]
        assert torch.cuda.memory_reserved(dev) >= torch.cuda.memory_allocated(dev)
        text = torch.cuda.memory_summary(dev)
        assert "Allocated memory" in text, text[:500]
        segs = torch.cuda.memory_snapshot()
        assert any(sg["address"] <= x.data_ptr() < sg["address"] + sg["total_size"] for sg in segs)
        del x
        return {"keys": len(s)}

    def snapshot_dump():
        path = os.path.join(args.out, "snapshot.pickle")
        torch.cuda.memory._record_memory_history(max_entries=100000)
        try:
            keep = [torch.empty((i + 1) * MiB, dtype=torch.uint8, device=dev) for i in range(8)]
            del keep[::2]
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                keep.append(torch.empty(7 * MiB, dtype=torch.uint8, device=dev))
            torch.cuda.memory._dump_snapshot(path)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        assert snap["segments"] and snap["device_traces"], "empty snapshot"
        live = {b["address"] for sg in snap["segments"] for b in sg["blocks"] if b["state"] == "active_allocated"}
        assert all(t.data_ptr() in live for t in keep), "a live tensor is missing from the snapshot"
        del keep
        return {"path": os.path.basename(path), "bytes": os.path.getsize(path)}

    def graph():
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).to(dev)
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
        assert pool_of(static_out.data_ptr()) != (0, 0), "the graph's output is not in a private pool"
        for i in range(3):
            new = torch.randn(64, 256, device=dev)
            static_in.copy_(new)
            g.replay()
            torch.cuda.synchronize()
            assert torch.allclose(static_out, model(new), rtol=1e-4, atol=1e-5)
        del g, static_out

    def stale_replay():
        """Seed 003 on the real driver: a captured in-place op writes a tensor freed before the
        replay. With debug_stale_access (fills in batches, flushed by the replay's wrapper) the
        write is reported with both stacks; the memory is never handed to another tensor."""
        xseg.set_config("debug_stale_access:True")
        xseg.torch.watch_graph_replays(torch)
        xseg.record_memory_history(enabled="state", stacks="python")
        reports = []
        xseg.attach_stale_observer(reports.append)
        try:
            def make_input():
                return torch.zeros(1 << 20, device=dev)

            x = make_input()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                x.add_(1)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                x.add_(1)
            ptr = x.data_ptr()
            del x  # out of scope before the replay: freed, quarantined
            other = torch.full((1 << 20,), 2.0, device=dev)
            assert other.data_ptr() != ptr, "a quarantined block was handed out"
            g.replay()  # flushes the waiting fills first, then writes the freed tensor
            torch.cuda.synchronize()
            found = xseg.check_stale()
            assert found == 1 and len(reports) == 1, (found, len(reports))
            r = reports[0]
            assert r["address"] == ptr, (hex(r["address"]), hex(ptr))
            names = [f["name"] for f in r["alloc_frames"]], [f["name"] for f in r["free_frames"]]
            assert "make_input" in names[0] and names[1], names
            assert bool((other == 2.0).all()), "another tensor changed"
            del g, other
            return {"first_offset": r["first_offset"], "alloc_frames": len(names[0]), "free_frames": len(names[1])}
        finally:
            xseg.record_memory_history(enabled=None)
            xseg.set_config("debug_stale_access:False")
            xseg.empty_cache()

    def compiled():
        try:
            import triton  # noqa: F401  (inductor's GPU backend)
        except ImportError as e:
            raise Skip("torch.compile needs triton: %s" % e)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
        f = torch.compile(model, mode="reduce-overhead")
        x = torch.randn(32, 256, device=dev)
        for _ in range(4):  # warm-up, recording, replays (cudagraph trees)
            with torch.no_grad():
                y = f(x)
        torch.cuda.synchronize()
        with torch.no_grad():
            want = model(x)
        assert torch.allclose(y, want, rtol=1e-3, atol=1e-4), float((y - want).abs().max())
        private = [sg for sg in xseg.memory_snapshot(0) if tuple(sg["segment_pool_id"]) != (0, 0)]
        return {"private_segments": len(private)}

    def pool_calls():
        """Count cudagraph trees' calls of the allocator's pool checks and checkpoint restores
        (they call them through torch._C at each use); returns the counts and an undo."""
        counts = {"checkPoolLiveAllocations": 0, "setCheckpointPoolState": 0, "getCheckpointState": 0}
        saved = {}
        for name in counts:
            attr = "_cuda_" + name
            fn = getattr(torch._C, attr, None)
            if fn is None:
                continue

            def wrap(*a, _fn=fn, _name=name, **k):
                counts[_name] += 1
                return _fn(*a, **k)
            saved[attr] = fn
            setattr(torch._C, attr, wrap)

        def undo():
            for attr, fn in saved.items():
                setattr(torch._C, attr, fn)
        return counts, undo

    def compiled_branches():
        """A cudagraph tree that branches: one compiled function with a graph break whose second
        graph depends on a flag, so after the first graph replays (execution) a second child is
        warmed up and recorded under it, which restores the pool's checkpoint
        (setCheckpointPoolState) and checks its live blocks (checkPoolLiveAllocations) in xseg."""
        try:
            import triton  # noqa: F401
        except ImportError as e:
            raise Skip("torch.compile needs triton: %s" % e)
        import torch._dynamo

        def branchy(x, flag):
            y = torch.sin(x) * 2 + x
            torch._dynamo.graph_break()
            return torch.cos(y) + 1 if flag else torch.tanh(y) * 3 - x

        def eager(x, flag):
            y = torch.sin(x) * 2 + x
            return torch.cos(y) + 1 if flag else torch.tanh(y) * 3 - x
        f = torch.compile(branchy, mode="reduce-overhead", dynamic=False)
        x = torch.randn(64, 1024, device=dev)
        counts, undo = pool_calls()
        try:
            worst = 0.0
            for flag in (True, True, True, False, False, False, True, False, True, False):
                with torch.no_grad():
                    y = f(x, flag).clone()  # a cudagraph output is overwritten by the next replay
                want = eager(x, flag)
                assert torch.allclose(y, want, rtol=1e-4, atol=1e-5), (flag, float((y - want).abs().max()))
                worst = max(worst, float((y - want).abs().max()))
            torch.cuda.synchronize()
        finally:
            undo()
        assert counts["checkPoolLiveAllocations"] > 0, "cudagraph trees never checked the pool: %s" % counts
        assert counts["setCheckpointPoolState"] > 0, (
            "the tree did not branch (no checkpoint restore), so this check proves less than it says: %s" % counts)
        return dict(counts, max_abs_diff=worst)

    def compiled_train_eval():
        """A training step (forward and backward graphs) and an eval step of another batch size,
        alternating, through one torch.compile(mode="reduce-overhead") model: losses, eval outputs
        and the weights after the steps match an eager copy trained alongside."""
        try:
            import triton  # noqa: F401
        except ImportError as e:
            raise Skip("torch.compile needs triton: %s" % e)
        import copy
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(dev)
        ref = copy.deepcopy(model)
        cm = torch.compile(model, mode="reduce-overhead", dynamic=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.05)
        counts, undo = pool_calls()
        worst = 0.0
        try:
            for step in range(6):
                xt = torch.randn(32, 128, device=dev)
                xe = torch.randn(48, 128, device=dev)
                torch.compiler.cudagraph_mark_step_begin()
                loss = cm(xt).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                rloss = ref(xt).square().mean()
                rloss.backward()
                ropt.step()
                ropt.zero_grad(set_to_none=True)
                assert torch.allclose(loss.detach(), rloss.detach(), rtol=1e-3, atol=1e-5), (step, float(loss), float(rloss))
                with torch.no_grad():
                    ye = cm(xe).clone()
                    re = ref(xe)
                assert torch.allclose(ye, re, rtol=1e-3, atol=1e-4), (step, float((ye - re).abs().max()))
                worst = max(worst, float((ye - re).abs().max()))
            torch.cuda.synchronize()
        finally:
            undo()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p, q, rtol=1e-3, atol=1e-5), float((p - q).abs().max())
        assert counts["checkPoolLiveAllocations"] > 0, "cudagraph trees never checked the pool: %s" % counts
        return dict(counts, max_abs_diff=worst)

    def mempool():
        if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
            raise Skip("this PyTorch (%s) has no torch.cuda.MemPool / use_mem_pool" % torch.__version__)
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            t = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
        u = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
        assert pool_of(t.data_ptr()) == tuple(pool.id), (pool_of(t.data_ptr()), pool.id)
        assert pool_of(u.data_ptr()) == (0, 0)
        t.fill_(7)
        torch.cuda.synchronize()
        assert int(t[123]) == 7
        del t, u, pool

    def mempool_allocator():
        """MemPool(allocator=CUDAPluggableAllocator(...)) (issue 73): the owner is NCCL's ncclMemAlloc /
        ncclMemFree from the NCCL PyTorch loaded (vLLM's pynccl_allocator pattern, one rank), else the
        driver's cuMemAlloc / cuMemFree; bytes written and read back bit for bit, every segment given
        back through the owner's free once the MemPool is gone."""
        if not (hasattr(torch.cuda, "use_mem_pool") and hasattr(torch.cuda.memory, "CUDAPluggableAllocator")):
            raise Skip("this PyTorch (%s) has no use_mem_pool / CUDAPluggableAllocator" % torch.__version__)
        so = build_owner(args, OWNER_C, "owner")
        owner = torch.cuda.memory.CUDAPluggableAllocator(so, "owner_alloc", "owner_free")
        lib = ctypes.CDLL(so)  # the same loaded object as the pluggable allocator's: one ledger
        lib.owner_stat.restype = ctypes.c_long
        try:
            pool = torch.cuda.MemPool(allocator=owner.allocator())
        except TypeError as e:
            raise Skip("this PyTorch's MemPool takes no allocator: %s" % e)
        sizes = (4096, 3 * MiB, 40 * MiB)
        want = [(torch.arange(n, dtype=torch.int64) * 131 + i).remainder(251).to(torch.uint8) for i, n in enumerate(sizes)]
        with torch.cuda.use_mem_pool(pool):
            ts = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
        for t, w in zip(ts, want):
            assert pool_of(t.data_ptr()) == tuple(pool.id), (pool_of(t.data_ptr()), pool.id)
            t.copy_(w)
        torch.cuda.synchronize()
        for t, w in zip(ts, want):
            assert torch.equal(t.cpu(), w), "bytes in the owner's memory differ"
        allocs, live = lib.owner_stat(0), lib.owner_stat(2)
        assert allocs >= 2 and live == allocs, (allocs, live)
        assert pool.use_count() == 1, pool.use_count()
        del ts
        torch.cuda.empty_cache()
        assert lib.owner_stat(1) == 0, "empty_cache gave a live MemPool's segments back"
        del pool
        import gc
        gc.collect()
        torch.cuda.empty_cache()
        frees, live, bad = lib.owner_stat(1), lib.owner_stat(2), lib.owner_stat(3)
        assert live == 0 and frees == allocs and bad == 0, dict(allocs=allocs, frees=frees, live=live, bad=bad)
        return {"owner": "ncclMemAlloc" if lib.owner_stat(4) == 1 else "cuMemAlloc", "segments": allocs}

    def mempool_managed():
        """MemPool over managed memory (issue 73): Megatron's unified-memory pool, a
        CUDAPluggableAllocator whose owner calls cudaMallocManaged / cudaFree (OWNER_MANAGED_C).
        Tensors written by the device and read by the host at their addresses, written by the
        host, prefetched to the host and back to the device (the driver's cuMemPrefetchAsync_v2
        through ctypes: PyTorch has no prefetch; skipped, and said so, where the driver lacks it)
        at the same address, read bit for bit after each; every segment given back through the
        owner's free once the MemPool is gone."""
        if not (hasattr(torch.cuda, "use_mem_pool") and hasattr(torch.cuda.memory, "CUDAPluggableAllocator")):
            raise Skip("this PyTorch (%s) has no use_mem_pool / CUDAPluggableAllocator" % torch.__version__)
        so = build_owner(args, OWNER_MANAGED_C, "managed_owner")
        owner = torch.cuda.memory.CUDAPluggableAllocator(so, "managed_alloc", "managed_free")
        lib = ctypes.CDLL(so)  # the same loaded object as the pluggable allocator's: one ledger
        lib.owner_stat.restype = ctypes.c_long
        try:
            pool = torch.cuda.MemPool(allocator=owner.allocator())
        except TypeError as e:
            raise Skip("this PyTorch's MemPool takes no allocator: %s" % e)

        class Location(ctypes.Structure):  # CUmemLocation
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
        cuda = ctypes.CDLL("libcuda.so.1")
        pf = getattr(cuda, "cuMemPrefetchAsync_v2", None)

        def prefetch(t, where):  # where: a Location; the current stream, then waited for
            r = pf(ctypes.c_uint64(t.data_ptr()), ctypes.c_size_t(t.numel()), where, ctypes.c_uint(0),
                   ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            assert r == 0, "cuMemPrefetchAsync_v2: CUresult %d" % r
            torch.cuda.synchronize()

        sizes = (4096, 3 * MiB, 40 * MiB)
        want = [(torch.arange(n, dtype=torch.int64) * 131 + i).remainder(251).to(torch.uint8) for i, n in enumerate(sizes)]
        again = [(torch.arange(n, dtype=torch.int64) * 17 + 3 * i + 1).remainder(253).to(torch.uint8)
                 for i, n in enumerate(sizes)]
        with torch.cuda.use_mem_pool(pool):
            ts = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
        ptrs = [t.data_ptr() for t in ts]
        for t, w in zip(ts, want):
            assert pool_of(t.data_ptr()) == tuple(pool.id), (pool_of(t.data_ptr()), pool.id)
            t.copy_(w)  # the device writes
        torch.cuda.synchronize()
        for t, w, a in zip(ts, want, again):
            assert ctypes.string_at(t.data_ptr(), t.numel()) == w.numpy().tobytes(), "host read of the device's bytes"
            ctypes.memmove(t.data_ptr(), a.numpy().tobytes(), t.numel())  # the host writes
        prefetched = pf is not None
        for t, a, p in zip(ts, again, ptrs):
            if prefetched:
                prefetch(t, Location(2, 0))  # CU_MEM_LOCATION_TYPE_HOST
                assert ctypes.string_at(t.data_ptr(), t.numel()) == a.numpy().tobytes(), "bytes on the host"
                prefetch(t, Location(1, dev.index))  # CU_MEM_LOCATION_TYPE_DEVICE
            assert t.data_ptr() == p
            assert torch.equal(t.cpu(), a), "bytes on the device"  # a device-to-host copy
        allocs, live = lib.owner_stat(0), lib.owner_stat(2)
        assert allocs >= 2 and live == allocs, (allocs, live)
        del ts
        torch.cuda.empty_cache()
        assert lib.owner_stat(1) == 0, "empty_cache gave a live MemPool's segments back"
        del pool
        import gc
        gc.collect()
        torch.cuda.empty_cache()
        frees, live, bad = lib.owner_stat(1), lib.owner_stat(2), lib.owner_stat(3)
        assert live == 0 and frees == allocs and bad == 0, dict(allocs=allocs, frees=frees, live=live, bad=bad)
        return {"owner": "cudaMallocManaged" if lib.owner_stat(4) == 1 else "cuMemAllocManaged", "segments": allocs,
                "prefetch": "cuMemPrefetchAsync_v2" if prefetched else "skipped: the driver has no cuMemPrefetchAsync_v2"}

    def mempool_symmetric():
        """PyTorch's symmetric-memory pool (issue 73; torch.distributed._symmetric_memory.get_mem_pool,
        a MemPool whose allocator is the symmetric-memory backend's) on one GPU, one rank: tensors
        allocated in it while xseg is PyTorch's allocator, written and read back bit for bit,
        rendezvous'd as symmetric memory, freed; xseg's default pool holds none of them."""
        try:
            import torch.distributed as dist
            import torch.distributed._symmetric_memory as symm
        except ImportError as e:
            raise Skip("this PyTorch has no torch.distributed._symmetric_memory: %s" % e)
        if not hasattr(symm, "get_mem_pool") or not dist.is_available() or not dist.is_nccl_available():
            raise Skip("this PyTorch (%s) has no symmetric-memory MemPool (get_mem_pool) or no NCCL" % torch.__version__)
        own_group = not dist.is_initialized()
        if own_group:
            store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="xseg-symm-", dir=args.out), "store"), 1)
            try:
                dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
            except Exception as e:  # no rendezvous here is the machine's, not xseg's
                raise Skip("one-rank NCCL process group: %s" % e)
        try:
            try:
                pool = symm.get_mem_pool(dev)
            except Exception as e:
                raise Skip("get_mem_pool(%s): %s" % (dev, e))
            sizes = (4096, 3 * MiB, 40 * MiB)
            want = [(torch.arange(n, dtype=torch.int64) * 29 + i).remainder(241).to(torch.uint8) for i, n in enumerate(sizes)]
            with torch.cuda.use_mem_pool(pool):
                ts = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
            for t, w in zip(ts, want):
                assert pool_of(t.data_ptr()) == tuple(pool.id), (pool_of(t.data_ptr()), pool.id)
                t.copy_(w)
            torch.cuda.synchronize()
            for t, w in zip(ts, want):
                assert torch.equal(t.cpu(), w), "bytes in the symmetric-memory pool differ"
            try:  # the backend's own handshake: recorded, not xseg's to pass or fail
                hdl = symm.rendezvous(ts[1], dist.group.WORLD.group_name)
                rendezvous = "world size %d" % hdl.world_size
                del hdl
            except Exception as e:
                rendezvous = "failed: %s" % str(e)[:200]
            del ts
            torch.cuda.synchronize()
            live = sum(b["size"] for seg in xseg.memory_snapshot(0) if tuple(seg["segment_pool_id"]) == tuple(pool.id)
                       for b in seg["blocks"] if b["state"] == "active_allocated")
            assert live == 0, "the symmetric-memory pool still holds %d allocated bytes" % live
            return {"pool": list(pool.id), "rendezvous": rendezvous}
        finally:
            if own_group:
                dist.destroy_process_group()

    def nccl_register():
        """Issue 76 item 6: xseg.nccl_register with the NCCL PyTorch loaded, at one rank. An xseg
        tensor's range goes to ncclCommRegister through xseg with the group's real communicator
        (ProcessGroupNCCL's _comm_ptr()), enters xseg's ledger (registration_stats' active), an
        all_reduce over the registered tensor leaves its bytes (a sum over one rank), and
        xseg.nccl_deregister takes the entry out again. NCCL refusing the registration at one rank
        is a skip with NCCL's words, not a failure."""
        try:
            import torch.distributed as dist
        except ImportError as e:
            raise Skip("no torch.distributed: %s" % e)
        if not dist.is_available() or not dist.is_nccl_available():
            raise Skip("this PyTorch (%s) has no NCCL" % torch.__version__)
        own_group = not dist.is_initialized()
        if own_group:
            store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="xseg-nccl-", dir=args.out), "store"), 1)
            try:
                dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
            except Exception as e:  # no rendezvous here is the machine's, not xseg's
                raise Skip("one-rank NCCL process group: %s" % e)
        config = xseg.get_config()
        xseg.set_config("expandable_segments:True")  # the ledger follows expandable segments only
        try:
            warm = torch.ones(1, device=dev)
            dist.all_reduce(warm)  # the communicator exists from the first collective on
            torch.cuda.synchronize()
            try:
                comm = xseg.nccl_comm(device=0)
            except (RuntimeError, ValueError) as e:
                raise Skip(str(e))
            n = 24 * MiB
            want = (torch.arange(n, dtype=torch.int64) * 7).remainder(251).to(torch.uint8)
            t = torch.empty(n, dtype=torch.uint8, device=dev)
            t.copy_(want)
            ptr = t.data_ptr()
            before = xseg.registration_stats(0)["active"]
            try:
                h = xseg.nccl_register(comm, ptr, n)
            except xseg.XsegError as e:
                if e.status_name in ("XSEG_ERROR_DRIVER", "XSEG_ERROR_NOT_SUPPORTED"):
                    raise Skip("xseg.nccl_register at one rank: %s" % e)
                raise
            try:
                active = xseg.registration_stats(0)["active"]
                assert active == before + 1, (before, active)
                dist.all_reduce(t)  # over the registered buffer
                torch.cuda.synchronize()
                assert torch.equal(t.cpu(), want), "all_reduce over the registered tensor changed its bytes"
            finally:
                xseg.nccl_deregister(comm, h)
            assert xseg.registration_stats(0)["active"] == before
            try:
                nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
            except Exception:
                nccl = "unknown"
            del t
            return {"nccl": nccl, "comm": hex(comm), "bytes": n}
        finally:
            xseg.set_config(config)
            if own_group:
                dist.destroy_process_group()

    def multiprocessing():
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        q, r = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=mp_child, args=(q, r))
        p.start()
        t = torch.full((MiB,), 2.0, device=dev)  # allocated by xseg, sent through CUDA IPC
        try:
            # Pickled here first, as Queue.put's feeder thread would: a tensor that cannot be
            # shared raises now instead of leaving the child waiting.
            from multiprocessing.reduction import ForkingPickler
            ForkingPickler.dumps(t)
            q.put(t)
            status, value, index = r.get(timeout=120)
        finally:
            p.join(60)
            if p.is_alive():
                p.kill()
        assert status == "ok", value
        assert value == 2.0 * MiB and index == 0, (value, index)
        del t

    def record_stream_edges():
        # Tensor.record_stream of an empty tensor and of memory xseg did not allocate returns
        # silently, as under PyTorch's own allocator (issue 34).
        s = torch.cuda.Stream()
        torch.empty(0, device=dev).record_stream(s)
        import ctypes
        cuda = ctypes.CDLL("libcuda.so.1")
        ptr = ctypes.c_uint64()
        assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(MiB)) == 0
        try:
            class Foreign:
                __cuda_array_interface__ = {"shape": (MiB,), "typestr": "|u1", "data": (ptr.value, False),
                                            "version": 2}
            t = torch.as_tensor(Foreign(), device=dev)
            assert t.data_ptr() == ptr.value
            t.record_stream(s)
            del t
        finally:
            torch.cuda.synchronize()
            cuda.cuMemFree_v2(ctypes.c_uint64(ptr.value))

    def queries():
        # Answered by xseg: the fraction, the history flag, one pool's snapshot, torch.accelerator.
        out = {}
        torch.cuda.set_per_process_memory_fraction(0.75, dev)
        assert abs(torch.cuda.get_per_process_memory_fraction(dev) - 0.75) < 1e-9
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.memory._record_memory_history(max_entries=1000)
        assert torch._C._cuda_isHistoryEnabled()
        torch.cuda.memory._record_memory_history(enabled=None)
        assert not torch._C._cuda_isHistoryEnabled()
        if hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool"):
            pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool):
                t = torch.empty(4 * MiB, dtype=torch.uint8, device=dev)
            u = torch.empty(4 * MiB, dtype=torch.uint8, device=dev)
            segs = pool.snapshot()
            assert segs and all(tuple(sg["segment_pool_id"]) == tuple(pool.id) for sg in segs), segs[:1]
            out["pool_segments"] = len(segs)
            del t, u
        acc = getattr(torch, "accelerator", None)
        if acc is not None and hasattr(acc, "memory_stats"):
            x = torch.empty(5 * MiB, dtype=torch.uint8, device=dev)
            assert acc.memory_stats(0)["allocated_bytes.all.current"] == xseg.memory_stats(0)["allocated_bytes.all.current"]
            del x
            out["accelerator"] = True
        return out

    def pinned():
        # PyTorch 2.8+: pin_memory() and the pinned buffers of non_blocking copies come from
        # xseg's host cache (the adapter's at::HostAllocator), their stats move, a copy through
        # them is correct, and a block is not reused while a copy from it is still queued.
        if not xseg.torch.pinned_installed():
            raise Skip(xseg.torch.pinned_reason())
        before = xseg.host_memory_stats()
        src = torch.arange(4 * MiB, dtype=torch.float32).pin_memory()
        assert src.is_pinned()
        xseg.host_record_stream(src.data_ptr(), 0)  # raises unless the pointer is an xseg host block
        st = xseg.host_memory_stats()
        assert st["allocation.current"] == before["allocation.current"] + 1, (before, st)
        assert st["allocated_bytes.current"] >= before["allocated_bytes.current"] + 16 * MiB
        ths = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
        if "num_host_alloc" in ths:  # PyTorch's view is xseg's figures
            assert ths["num_host_alloc"] == st["num_host_alloc"], (ths, st)
        d = src.to(dev, non_blocking=True)
        back = d.to("cpu", non_blocking=True)  # a pinned destination, from xseg too
        torch.cuda.current_stream().synchronize()
        assert back.is_pinned() and torch.equal(back, src)
        xseg.host_record_stream(back.data_ptr(), 0)
        # A copy queued behind a long kernel: the freed source must not be handed out again.
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.cuda._sleep(int(2e9))
            d2 = src.to(dev, non_blocking=True)
        ptr = src.data_ptr()
        del src
        again = torch.empty(4 * MiB, dtype=torch.float32, pin_memory=True)
        reused = again.data_ptr() == ptr
        s.synchronize()
        assert not reused, "a pinned block was reused while a copy from it was queued"
        assert torch.equal(d2.cpu(), torch.arange(4 * MiB, dtype=torch.float32))
        del back, again, d, d2
        return {"num_host_alloc": xseg.host_memory_stats()["num_host_alloc"]}

    report("xseg.torch.enable", allocator)
    report("pinned tensors from xseg's host cache", pinned)
    report("record_stream of an empty tensor and of foreign memory", record_stream_edges)
    report("fraction, history flag, MemPool.snapshot, torch.accelerator", queries)
    report("stats, summary and snapshot through torch.cuda", stats_summary_snapshot)
    report("torch.cuda.memory._dump_snapshot", snapshot_dump)
    report("debug_stale_access snapshot (stale_snapshot.pickle)", lambda: stale_snapshot(xseg, args.out))
    report("torch.cuda.graph", graph)
    report("stale access under graph replay (debug_stale_access)", stale_replay)
    report('torch.compile(mode="reduce-overhead")', compiled)
    report('torch.compile(mode="reduce-overhead"): a branching cudagraph tree', compiled_branches)
    report('torch.compile(mode="reduce-overhead"): train and eval steps of two shapes', compiled_train_eval)
    report("torch.cuda.MemPool", mempool)
    report("torch.cuda.MemPool(allocator=CUDAPluggableAllocator)", mempool_allocator)
    report("torch.cuda.MemPool over managed memory", mempool_managed)
    report("torch.distributed._symmetric_memory pool", mempool_symmetric)
    report("xseg.nccl_register: ncclCommRegister through the ledger, one rank", nccl_register)
    report("torch.multiprocessing", multiprocessing)
    # xseg.compat: torch_memory_saver's and vLLM's own tests, ported, each in a process of its own
    # (tests/python/compat_torch_script.py; its --list is what check_torch.sh skips without torch).
    for case in compat_cases():
        report("xseg.compat: " + case, lambda case=case: compat_case(args, case))


COMPAT_SCRIPT = os.path.join(HERE, "..", "..", "tests", "python", "compat_torch_script.py")


def compat_cases():
    """The names of tests/python/compat_torch_script.py's cases (its --list; no torch needed)."""
    r = subprocess.run([sys.executable, COMPAT_SCRIPT, "--list"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("compat_torch_script.py --list failed: " + r.stderr[-2000:])
    return r.stdout.split()


def compat_case(args, case):
    """One case of compat_torch_script.py in a process of its own, over the libxseg under test."""
    env = dict(os.environ, XSEG_LIBRARY=os.path.abspath(args.lib))
    r = subprocess.run([sys.executable, COMPAT_SCRIPT, case], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise AssertionError("compat_torch_script.py %s exited %d:\n%s" % (case, r.returncode,
                                                                         (r.stdout + r.stderr)[-2500:]))
    return {"output": r.stdout.strip().splitlines()[-1:]}


# --- group services ------------------------------------------------------------------------------

def services_checks(args, xseg, torch):
    dev = torch.device("cuda", 0)
    gib = 1 if args.quick else 4

    def pinned_rate(n):
        """GiB/s of a pinned copy each way in this call (n bytes, median of 3): the link's speed
        the sleep and wake are held to."""
        src = torch.empty(n, dtype=torch.uint8, device=dev)
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        out = {}
        for name, dst, s in (("dtoh", host, src), ("htod", src, host)):
            ts = []
            for _ in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                dst.copy_(s, non_blocking=True)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
            out[name] = n / GiB / sorted(ts)[1]
        del src, host
        return out

    def sleep_wake():
        """Sleep and wake of `gib` GiB of live tensors, three cycles each way and mode: the first
        offload pins its backup, the next ones reuse it (sleep_keep_host_backup); GiB/s beside the
        pinned copy of this call, and the time from the wake's return until a kernel on woken
        memory has run."""
        link = pinned_rate(GiB)
        out = {"pinned_dtoh_gib_s": link["dtoh"], "pinned_htod_gib_s": link["htod"]}
        for offload in (True, False):
            ts = [torch.full((GiB // 4,), float(i + 1), device=dev) for i in range(gib)]  # 1 GiB each
            cycles = []
            for cycle in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                xseg.sleep(offload=offload)
                t1 = time.perf_counter()
                released = xseg.sleep_stats(xseg.DEFAULT_POOL)["released_bytes"]
                xseg.wake()
                t2 = time.perf_counter()
                ts[0].add_(0)  # a kernel on woken memory
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                for i, t in enumerate(ts):
                    want = float(i + 1) * (GiB // 4) if offload else 0.0
                    got = float(t.double().sum())
                    assert got == want, ("offload" if offload else "discard", cycle, i, got, want)
                    if not offload:
                        t.fill_(float(i + 1))
                cycles.append({"sleep_s": t1 - t0, "wake_s": t2 - t1, "first_kernel_s": t3 - t2,
                               "sleep_gib_s": gib / (t1 - t0), "wake_gib_s": gib / (t2 - t1),
                               "sleep_x_pinned": gib / (t1 - t0) / link["dtoh"],
                               "wake_x_pinned": gib / (t2 - t1) / link["htod"]})
            mode = "offload" if offload else "discard"
            out[mode] = {"gib": gib, "released_bytes": released, "first": cycles[0],
                         "kept": sorted(cycles[1:], key=lambda c: c["sleep_s"])[0]}
            del ts
            torch.cuda.empty_cache()
        return out

    def graph_after_wake():
        """A CUDA graph whose pool is tagged "graphs" and whose weights and input sit in the
        default pool, tagged "weights": level 1 (weights offloaded, graphs discarded), woken tag by
        tag, then replayed: the output equals the one replayed before the sleep, bit for bit."""
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).to(dev)
        static_in = torch.randn(128, 512, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model(static_in)
        torch.cuda.current_stream().wait_stream(s)
        pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            static_out = model(static_in)
        g.replay()
        torch.cuda.synchronize()
        before = static_out.clone()
        xseg.set_pool_tag(pool, "graphs")
        xseg.set_pool_tag(xseg.DEFAULT_POOL, "weights")
        try:
            t0 = time.perf_counter()
            xseg.sleep(tags=["weights", "graphs"], offload=["weights"])
            t1 = time.perf_counter()
            assert xseg.sleep_stats(pool)["asleep"] == 1 and xseg.sleep_stats(xseg.DEFAULT_POOL)["asleep"] == 1
            xseg.wake(tags=["weights", "graphs"])
            t2 = time.perf_counter()
            g.replay()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
        finally:
            if xseg.sleep_stats(xseg.DEFAULT_POOL)["asleep"] or xseg.sleep_stats(pool)["asleep"]:
                xseg.wake(tags=["weights", "graphs"])
            xseg.set_pool_tag(pool, None)
            xseg.set_pool_tag(xseg.DEFAULT_POOL, None)
        assert torch.equal(static_out, before), "replay after a tagged wake differs from the replay before the sleep"
        assert torch.allclose(static_out, model(static_in), rtol=1e-4, atol=1e-5), "replay differs from eager"
        del g, static_out
        return {"sleep_s": t1 - t0, "wake_s": t2 - t1, "replay_after_wake_s": t3 - t2}

    def trim():
        ts = [torch.empty(64 * MiB, dtype=torch.uint8, device=dev) for _ in range(16 * gib)]
        del ts
        before = xseg.memory_stats(0)
        keep = 256 * MiB
        t0 = time.perf_counter()
        xseg.trim(keep)
        t1 = time.perf_counter()
        after = xseg.memory_stats(0)
        cached = after["reserved_bytes.all.current"] - after["allocated_bytes.all.current"]
        assert cached <= keep, (cached, keep)
        return {"cache_before": before["reserved_bytes.all.current"] - before["allocated_bytes.all.current"],
                "cache_after": cached, "trim_s": t1 - t0}

    def spill_contract():
        """spill_to_host on the GPU (docs/services.md): A and B declared cold (mark_cold) spill
        when the device runs out (a memory fraction just above what is reserved); B's declaration
        ends while C holds the room, so its pages stay on host memory. Then, while another thread
        promotes in a loop (xseg.promote, empty_cache, trim), kernels on a side stream write B (on
        host memory, not declared: never moved) and U (never declared); C goes, A is taken back
        (mark_cold(A, cold=False)) and written the same way. Every byte compared after."""
        import threading
        import xseg.torch as xt
        xseg.set_config("spill_to_host:True")
        n = 64 * MiB // 4
        total = torch.cuda.get_device_properties(0).total_memory
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            a = torch.full((n,), 1.0, device=dev)
            b = torch.full((n,), 2.0, device=dev)
            u = torch.full((n,), 3.0, device=dev)
            torch.cuda.synchronize()
            xt.mark_cold(a)
            xt.mark_cold(b)
            reserved = xseg.memory_stats(0)["reserved_bytes.all.current"]
            xseg.set_per_process_memory_fraction((reserved + 64 * MiB) / total, 0)
            c = torch.empty(160 * MiB, dtype=torch.uint8, device=dev)  # spills A and B
            spilled = xseg.memory_stats(0)["spilled_bytes.all.current"]
            assert spilled >= 96 * MiB, spilled
            xt.mark_cold(b, cold=False)  # no room: B stays on host memory, the program's again
            where_b = xseg.block_location(b.data_ptr())
            assert where_b[0] != "device", where_b
            stop, errors = threading.Event(), []

            def promoter():
                while not stop.is_set():
                    try:
                        xseg.promote()
                    except xseg.XsegError as e:
                        if e.status_name != "XSEG_ERROR_OUT_OF_MEMORY":
                            errors.append(str(e))
                    xseg.empty_cache()
                    xseg.trim(0)

            t = threading.Thread(target=promoter)
            t.start()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for _ in range(50):
                    b.add_(1.0)  # a spilled block written by kernels while another thread promotes
                    u.add_(1.0)
            del c
            xt.mark_cold(a, cold=False)  # A's pages back (if the promoter did not bring them first)
            with torch.cuda.stream(s):
                for _ in range(50):
                    a.add_(1.0)
            s.synchronize()
            stop.set()
            t.join()
            assert not errors, errors
            after_b = xseg.block_location(b.data_ptr())
            # The comparisons allocate (a bool tensor as large as each): room first. On the H200
            # (2026-11-26) they ran under the fraction and failed with an OOM, not a lost byte.
            xseg.set_per_process_memory_fraction(1.0, 0)
            for name, x, want in (("A", a, 51.0), ("B", b, 52.0), ("U", u, 53.0)):
                bad = int((x != want).sum().item())
                assert bad == 0, "%s: %d of %d floats lost their writes" % (name, bad, n)
            assert after_b[0] != "device", "B moved while it was not declared: %s" % (after_b,)
            xt.mark_cold(b, cold=False)  # now with room: B comes back
            assert xseg.block_location(b.data_ptr())[0] == "device"
            st = xseg.memory_stats(0)
            return {"spilled_bytes": spilled, "num_spills": st["num_spills"], "num_promotions": st["num_promotions"],
                    "spill_numa_node": st["spill_numa_node"], "spill_numa_fallback": st["spill_numa_fallback"],
                    "b_on_host_while_written": where_b[1]}
        finally:
            xseg.set_per_process_memory_fraction(1.0, 0)
            xseg.set_config("spill_to_host:False")

    report("sleep and wake", sleep_wake)
    report("graph replayed after a tagged wake", graph_after_wake)
    report("trim", trim)
    report("spill contract", spill_contract)


def stale_snapshot(xseg, out):
    """debug_stale_access switched on at run time: a block freed, then written through the driver
    (the stale write a graph replay makes), found when the snapshot checks the quarantine; the
    snapshot, with history, into OUT/stale_snapshot.pickle for memory-viz (check_snapshots.sh)."""
    import ctypes
    cu = ctypes.CDLL(os.environ.get("XSEG_LIBCUDA") or "libcuda.so.1")  # the driver xseg loaded
    cu.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
    cu.cuMemsetD8_v2.restype = ctypes.c_int
    path = os.path.join(out, "stale_snapshot.pickle")
    xseg.set_config("debug_stale_access:True")
    xseg.record_memory_history()
    try:
        keep = xseg.malloc(2 * MiB)  # also makes the device's context current on this thread
        p = xseg.malloc(3 * MiB)
        xseg.free(p)
        xseg.stale_flush()  # the fills wait for their batch (debug_stale_fill_batch) until flushed
        r = cu.cuMemsetD8_v2(p, 0x5A, 4096)
        assert r == 0, "cuMemsetD8 into the freed block returned %d" % r
        xseg.dump_snapshot(path)
        xseg.free(keep)
    finally:
        xseg.record_memory_history(enabled=None)
        xseg.set_config("debug_stale_access:False")
        xseg.empty_cache()  # the quarantine drains once the mode is off
    with open(path, "rb") as f:
        snap = pickle.load(f)
    found = [e for t in snap["device_traces"] for e in t
             if e["action"] == "snapshot" and e["frames"] and e["frames"][0]["name"].startswith("STALE WRITE")]
    assert len(found) == 1 and found[0]["addr"] == p, "findings in the trace: %r" % found
    return {"path": os.path.basename(path), "bytes": os.path.getsize(path)}


def snapshot_emulator(args):
    """xseg's own snapshot with history (no torch), written where check_snapshots.sh looks."""
    from xseg_source import import_xseg_core
    xseg = import_xseg_core(args.lib)

    def write():
        xseg.record_memory_history()
        ptrs = [xseg.malloc((i + 1) * MiB) for i in range(6)]
        for p in ptrs[::2]:
            xseg.free(p)
        path = os.path.join(args.out, "snapshot.pickle")
        xseg.dump_snapshot(path)
        xseg.record_memory_history(enabled=None)
        for p in ptrs[1::2]:
            xseg.free(p)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        assert snap["segments"] and snap["device_traces"], "empty snapshot"
        return {"path": os.path.basename(path), "bytes": os.path.getsize(path)}

    report("xseg.dump_snapshot (no torch)", write)
    report("debug_stale_access snapshot (stale_snapshot.pickle)", lambda: stale_snapshot(xseg, args.out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--group", choices=["torch", "services", "snapshot-emulator"], required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.group == "snapshot-emulator":
        snapshot_emulator(args)
        return 0
    from xseg_source import import_xseg
    xseg = import_xseg(args.lib)
    xseg.torch.enable()  # before PyTorch's first CUDA allocation
    import torch
    torch_checks(args, xseg, torch) if args.group == "torch" else services_checks(args, xseg, torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
