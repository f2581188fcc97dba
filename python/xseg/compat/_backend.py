"""The two backends the compat modules (xseg.compat.torch_memory_saver, xseg.compat.vllm) run
over. A backend makes private pools, tags them for xseg's sleep by tag, routes allocations into
one of them for the length of a `with` block, and sleeps and wakes tags on a device.

- TorchBackend (what an engine uses): a pool is a torch.cuda.MemPool entered with
  torch.cuda.use_mem_pool, so every tensor made inside the block lands in it; CUDA graphs are
  captured with torch.cuda.graph. Needs xseg.torch.enable() (xseg must be PyTorch's allocator:
  otherwise the MemPool's memory is PyTorch's and xseg cannot sleep it).
- XsegBackend (no torch): a pool is an xseg private pool (xseg_pool_create) routed to with
  xseg_begin_allocate_to_pool / xseg_end_allocate_to_pool, so xseg.malloc inside the block lands
  in it. It exists so that the compat semantics are tested on cudaemu where torch is absent; it
  has no CUDA graphs.

default_backend() picks TorchBackend when torch imports, XsegBackend otherwise.
"""
import ctypes
import re
from contextlib import contextmanager

import xseg
from xseg import _lib

_TAG_RE = re.compile(r"^[A-Za-z0-9_.-]{1,31}$")


class TagNames:
    """Maps a framework's tag (any str) plus a variant suffix to an xseg tag (1-31 characters of
    [A-Za-z0-9_.-]), one to one: PREFIX.TAG[.SUFFIX] when TAG has no '.' and the name fits, else
    PREFIX-N[.SUFFIX] with N the order in which TAG was first seen. The two forms cannot meet
    (PREFIX. against PREFIX-), and TAG without a '.' cannot end in another TAG's .SUFFIX, so any
    str works and distinct (tag, suffix) pairs never share an xseg tag."""

    _PLAIN = re.compile(r"^[A-Za-z0-9_-]+$")

    def __init__(self, prefix):
        self._prefix = prefix
        self._index = {}

    def xseg_tag(self, tag, suffix=""):
        tail = "." + suffix if suffix else ""
        name = "%s.%s%s" % (self._prefix, tag, tail)
        if self._PLAIN.match(tag) and _TAG_RE.match(name):
            return name
        n = self._index.setdefault(tag, len(self._index))
        return "%s-%d%s" % (self._prefix, n, tail)


class XsegBackend:
    """Pools of xseg's own (no torch): see the module's docstring."""

    name = "xseg"

    def current_device(self):
        return 0

    def make_pool(self, xtag, device):
        """A new private pool on `device` tagged `xtag`; returns its (first, second) id. The pool
        keeps one use (as a MemPool holds one) until release_pool()."""
        pid = _lib.PoolId()
        _lib.check(_lib.need("xseg_pool_create")(ctypes.byref(pid)))
        pool = (pid.first, pid.second)
        # xseg learns a pool on the device at its first begin, which adds the use the pool keeps;
        # so the tag has a pool to sit on before anything is allocated.
        self._begin(pool, device)
        self._end(pool, device)
        if xtag is not None:
            xseg.set_pool_tag(pool, xtag, device)
        return pool

    def _begin(self, pool, device):
        f = _lib.need("xseg_begin_allocate_to_pool")
        f.argtypes = [ctypes.c_int, _lib.PoolId, ctypes.c_void_p, ctypes.c_void_p]
        _lib.check(f(device, _lib.PoolId(*pool), None, None))

    def _end(self, pool, device):
        f = _lib.need("xseg_end_allocate_to_pool")
        f.argtypes = [ctypes.c_int, _lib.PoolId]
        _lib.check(f(device, _lib.PoolId(*pool)))

    @contextmanager
    def use_pool(self, pool, device):
        """Route xseg.malloc on every stream of `device` to `pool` for the block. Each begin adds
        a use; it is dropped at the end, so that only make_pool's stays."""
        self._begin(pool, device)
        try:
            yield
        finally:
            self._end(pool, device)
            self._release(pool, device)

    def _release(self, pool, device):
        f = _lib.need("xseg_release_pool")
        f.argtypes = [ctypes.c_int, _lib.PoolId]
        _lib.check(f(device, _lib.PoolId(*pool)))

    def release_pool(self, pool, device):
        """Drop make_pool's use: live blocks stay valid (they return to the pool when freed), the
        cache goes at the next empty_cache, and the pool is forgotten once it holds no memory."""
        self._release(pool, device)

    def empty_cache(self):
        xseg.empty_cache()

    @contextmanager
    def graph(self, cuda_graph, pool, stream, capture_error_mode, xtag, device, on_pool):
        raise NotImplementedError(
            "xseg.compat: CUDA graph capture needs torch (the xseg backend has no graphs); "
            "use the torch backend (import torch before the first use)")
        yield  # pragma: no cover  (a generator, so that the error comes at `with`)


class TorchBackend:
    """torch.cuda.MemPool pools entered with torch.cuda.use_mem_pool: see the module's docstring."""

    name = "torch"

    def __init__(self):
        import torch
        import xseg.torch
        self._torch = torch
        self._xt = xseg.torch

    def current_device(self):
        return self._torch.cuda.current_device()

    def make_pool(self, xtag, device):
        # A MemPool made while PyTorch's own allocator is in charge holds PyTorch's memory, which
        # xseg cannot sleep: refuse rather than pause nothing later.
        if not self._xt.is_enabled():
            raise RuntimeError("xseg.compat: xseg is not PyTorch's allocator in this process; call "
                               "xseg.torch.enable() before the first CUDA allocation")
        torch = self._torch
        with torch.cuda.device(device):
            pool = torch.cuda.MemPool()
        if xtag is not None:
            xseg.set_pool_tag(pool, xtag, device)
        return pool

    @contextmanager
    def use_pool(self, pool, device):
        with self._torch.cuda.use_mem_pool(pool, device=device):
            yield

    def release_pool(self, pool, device):
        # A MemPool is released when its last reference goes (PyTorch's release hook).
        pass

    def empty_cache(self):
        self._torch.cuda.empty_cache()

    @contextmanager
    def graph(self, cuda_graph, pool, stream, capture_error_mode, xtag, device, on_pool):
        """torch.cuda.graph into `pool` (a fresh graph pool when None), tagged `xtag` once the
        capture has made it known to xseg; on_pool(pool) records it for pause/resume."""
        torch = self._torch
        if pool is None:
            pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
            xseg.set_pool_tag(pool, xtag, device)
            on_pool(pool)
            yield


def default_backend():
    """TorchBackend when torch imports, XsegBackend otherwise."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return XsegBackend()
    return TorchBackend()
