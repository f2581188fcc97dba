"""xseg as PyTorch's CUDA allocator, with every hook wired.

    import xseg.torch
    xseg.torch.enable()          # before the first CUDA allocation

A bare torch.cuda.memory.CUDAPluggableAllocator("libxseg.so", "xseg_torch_malloc",
"xseg_torch_free") calls only malloc and free: Tensor.record_stream() silently does nothing (a
side stream's memory can be reused under it), torch.cuda.empty_cache() and
set_per_process_memory_fraction() never reach xseg, and memory_stats()/memory_summary()/
_snapshot() raise. enable() instead builds (once, cached by torch.utils.cpp_extension) a small C++
adapter that subclasses PyTorch's CUDAPluggableAllocator, sets every hook (record_stream,
empty_cache, memory fraction, init, base allocation, and the allocate-to-pool hooks
torch.cuda.graph and MemPool use) and answers from xseg the statistics (memory_stats,
reset_peak_memory_stats, reset_accumulated_memory_stats), cacheInfo (cuDNN benchmark mode),
snapshot, history and OOM-observer calls.

Also answered: record_stream of empty tensors and foreign memory (silently), cudagraph trees'
checkpoints (getCheckpointState/setCheckpointPoolState), peer access and peer copies, get_per_process_memory_fraction,
_cuda_isHistoryEnabled, attachAllocatorTraceTracker (from xseg's segment observers), CUDA IPC
of tensors for torch.multiprocessing, MemPool.snapshot() per pool, torch.accelerator.*.
Refused with what to do instead: MemPool(use_on_oom=True), MemPool(no_split=True).
From PyTorch 2.8, pinned tensors come from xseg's host cache too (enable(pinned=False) keeps
PyTorch's; pinned_installed() and pinned_reason() say which).
docs/python.md lists what is answered on which PyTorch.

Needs a CUDA build of PyTorch (2.1 or newer) and a C++ compiler.
"""
import os
import sys

from . import _lib
from . import set_config

__all__ = ["enable", "is_enabled", "watch_graph_replays", "pinned_installed", "pinned_reason", "adapter_source",
           "header_dir", "set_pool_tag", "sleep", "wake"]

_enabled = False
_pinned_reason = "xseg.torch.enable() has not run"


def adapter_source():
    """Path of the adapter's C++ source."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_adapter.cpp")


def header_dir():
    """A folder holding xseg.h: beside the package (pip install), the source tree, or the
    system include folders (meson install)."""
    here = os.path.dirname(os.path.abspath(__file__))
    libdir = os.path.dirname(os.path.realpath(_lib.library_path()))
    cands = [here, os.path.join(here, "..", "..", "include"),
             os.path.join(libdir, "..", "include"), os.path.join(libdir, "..", "..", "include"),
             "/usr/local/include", "/usr/include"]
    env = os.environ.get("XSEG_INCLUDE_DIR")
    if env:
        cands.insert(0, env)
    for c in cands:
        if os.path.isfile(os.path.join(c, "xseg.h")):
            return os.path.abspath(c)
    raise FileNotFoundError("xseg.torch: xseg.h not found (looked in %s); set XSEG_INCLUDE_DIR"
                            % ", ".join(cands))


def is_enabled():
    """True once enable() has installed xseg in this process."""
    return _enabled


def pinned_installed():
    """True when enable() made xseg's pinned host cache PyTorch's CUDA host allocator (pinned
    tensors, non_blocking copies' pinned buffers, torch.cuda.host_memory_stats()); False, with
    pinned_reason() saying why, before enable(), with pinned=False, or on PyTorch before 2.8."""
    return _pinned_reason == ""


def pinned_reason():
    """Why pinned tensors do not come from xseg's host cache (one line); "" when they do."""
    return _pinned_reason


def _torch_device(device):
    """`device` as an index (None: torch's current device; an int; a torch.device or "cuda:N")."""
    import torch
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError("xseg.torch: %r is not a CUDA device" % (device,))
    return d.index if d.index is not None else torch.cuda.current_device()


def set_pool_tag(pool, tag, device=None):
    """Tag a torch.cuda.MemPool (or a graph pool handle, torch.cuda.graph_pool_handle(), or
    xseg.DEFAULT_POOL for every tensor outside a pool) with `tag` ("weights", "kv_cache", "graphs"
    or yours; None clears it), on `device` (default: torch's current device). Tag the pool when
    you make it, before it allocates: sleep(tags=...) then covers every pool of the tag.

        weights = torch.cuda.MemPool()
        xseg.torch.set_pool_tag(weights, "weights")
        with torch.cuda.use_mem_pool(weights):
            model = load()
    """
    import xseg
    xseg.set_pool_tag(pool, tag, _torch_device(device))


def sleep(tags, offload=True, device=None):
    """Put every pool carrying `tags` to sleep on `device` (default: torch's current device):
    their device memory goes back to the driver while every tensor and captured CUDA graph keeps
    its address. `offload`: True (keep every tag's bytes in pinned host memory), False (drop them:
    they read zero after the wake) or the tags to keep. vLLM's levels: sleep(["weights",
    "kv_cache", "graphs"], offload=["weights"]) (level 1), offload=False (level 2). Tensors of
    these pools must not be used until wake(); xseg.sleep(tags=...) says the rest."""
    import xseg
    xseg.sleep(tags=tags, offload=offload, device=_torch_device(device))


def wake(tags, device=None):
    """Wake the sleeping pools carrying `tags`, tag by tag in the order given (wake(["weights"])
    before an RL step's weight update, wake(["kv_cache", "graphs"]) before serving): the same
    addresses, the kept bytes back, discarded ones zero. Graphs captured before the sleep replay
    as they were."""
    import xseg
    xseg.wake(tags=tags, device=_torch_device(device))


def mark_cold(tensor, cold=True):
    """Declare `tensor`'s storage cold: you promise that nothing reads or writes it (no kernel on
    any stream, no copy, no graph replay) until mark_cold(tensor, cold=False) returns. With
    spill_to_host:True its pages may move to host memory meanwhile (the tensor keeps its address).
    cold=False ends the declaration and brings the pages back before it returns (see
    xseg.spill_hint). Only declared storages ever move. Names the tensor's storage, which xseg
    allocated (enable() first); the whole storage, views included."""
    import xseg
    xseg.spill_hint(tensor.untyped_storage().data_ptr(), cold=cold)


def enable(config=None, verbose=False, pinned=True, debug_stale_access=False, debug_quarantine_mb=None):
    """Install xseg as PyTorch's CUDA allocator with every hook wired.

    config: an optional xseg config string applied first (e.g. "expandable_segments:True").
    debug_stale_access: the stale-access debug mode (docs/troubleshooting.md): freed tensors are
    quarantined and poisoned, writes after their free reported with the allocation's and the
    free's Python frames (history recording starts in "state" mode for them);
    debug_quarantine_mb bounds the quarantine (default 1024). Freed tensors are poisoned in
    batches (debug_stale_fill_batch), so every torch.cuda.CUDAGraph.replay first fills the
    waiting ones (watch_graph_replays()): a replay using a freed tensor meets the pattern.
    pinned: also make xseg's pinned host cache PyTorch's CUDA host allocator where PyTorch has a
    registry for it (2.8 and later; see pinned_installed()). Pinned tensors made before keep
    their allocator until freed.
    Must run before PyTorch's first CUDA allocation (PyTorch refuses to change its allocator
    after that). Calling it again is a no-op."""
    global _enabled, _pinned_reason
    if _enabled:
        return
    if not isinstance(pinned, bool):
        raise TypeError("xseg.torch.enable: pinned must be True or False, not %r" % (pinned,))
    import torch  # noqa: F401 (a clear ImportError when torch is missing)
    import torch.utils.cpp_extension as cpp
    if not torch.cuda.is_available() and torch.version.cuda is None:
        raise RuntimeError("xseg.torch.enable: this PyTorch has no CUDA support "
                           "(torch.version.cuda is None)")
    if not isinstance(debug_stale_access, bool):
        raise TypeError("xseg.torch.enable: debug_stale_access must be True or False, not %r"
                        % (debug_stale_access,))
    if debug_stale_access:
        extra = "debug_stale_access:True"
        if debug_quarantine_mb is not None:
            if isinstance(debug_quarantine_mb, bool) or not isinstance(debug_quarantine_mb, int):
                raise TypeError("xseg.torch.enable: debug_quarantine_mb must be an int, not %r"
                                % (debug_quarantine_mb,))
            extra += ",debug_quarantine_mb:%d" % debug_quarantine_mb
        config = extra if config is None else config + "," + extra
    elif debug_quarantine_mb is not None:
        raise ValueError("xseg.torch.enable: debug_quarantine_mb needs debug_stale_access=True")
    if config is not None:
        set_config(config)
    if debug_stale_access:
        import xseg
        xseg.record_memory_history(enabled="state", stacks="python")
        watch_graph_replays(torch)
    _lib.lib()  # load libxseg with RTLD_GLOBAL: the adapter's xseg_* references bind to it
    tag = "xseg_torch_adapter_" + torch.__version__.replace(".", "_").replace("+", "_")
    mod = cpp.load(name=tag.replace("-", "_"), sources=[adapter_source()],
                   extra_include_paths=[header_dir()], extra_cflags=["-O2"],
                   with_cuda=True, verbose=verbose)
    mod.install()
    _pinned_reason = mod.install_host() if pinned else "enable(pinned=False)"
    _answer_history_calls(torch)
    _enabled = True


def watch_graph_replays(torch=None):
    """Make every torch.cuda.CUDAGraph.replay() call xseg.stale_flush() first (the device of the
    current stream), so that blocks freed since the last flush hold the stale-access pattern
    before the replay reads or writes them (debug_stale_access; enable(debug_stale_access=True)
    calls it; call it yourself after switching the mode on with set_config). Idempotent."""
    if torch is None:
        import torch
    graph = torch.cuda.CUDAGraph
    replay = graph.replay
    if getattr(replay, "_xseg_flushes", False):
        return
    import xseg

    def _replay(self, *args, **kwargs):
        xseg.stale_flush()  # the fills waiting for their batch go before the replay's work
        return replay(self, *args, **kwargs)

    _replay._xseg_flushes = True
    _replay.__wrapped__ = replay
    _replay.__doc__ = replay.__doc__
    graph.replay = _replay


def _answer_history_calls(torch):
    """torch.cuda.memory's history and snapshot functions, answered by xseg with Python frames
    and trace events (PyTorch's C++ context recorder hands frames that only PyTorch can read)."""
    import xseg
    mem = torch.cuda.memory

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                               device=None, clear_history=False, **_):
        xseg.record_memory_history(enabled=enabled, context=context, stacks=stacks,
                                   max_entries=max_entries, device=device,
                                   clear_history=clear_history)

    def _snapshot(device=None, *_, **__):
        return xseg._snapshot()

    def memory_snapshot(*args, mempool_id=None, **__):
        # torch.cuda.memory_snapshot(mempool_id=None); MemPool.snapshot() passes its id.
        if mempool_id is None and args:
            mempool_id = args[0]
        return xseg._pool_segments(xseg._snapshot()["segments"], mempool_id)

    mem._record_memory_history = _record_memory_history
    mem._snapshot = _snapshot
    mem.memory_snapshot = memory_snapshot
    torch.cuda.memory_snapshot = memory_snapshot
