"""torch_memory_saver's public API over xseg's sleep by tag.

Re-implemented (no code or prose copied) from fzyzcjy/torch_memory_saver at commit
4a43c97771f139db0215c1378e8a0b50e679d23d (2026-08-20; torch_memory_saver/entrypoint.py,
hooks/mode_preload.py, csrc/core.cpp). SGLang and verl switch by import:
xseg.compat.install_aliases() makes `import torch_memory_saver` this module (docs/guide.md).

    from torch_memory_saver import torch_memory_saver      # after install_aliases()
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = load()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(...)
    torch_memory_saver.pause()          # every region's memory goes back to the driver
    torch_memory_saver.resume()         # same addresses; "weights" bytes back, "kv_cache" zeros

How it maps: each (tag, enable_cpu_backup, device) has one private pool (a torch.cuda.MemPool,
entered with torch.cuda.use_mem_pool) carrying an xseg tag (tms.TAG.cpu with backup, tms.TAG
without; tms-N and tms-N.cpu when TAG has a '.' or does not fit xseg's 31 characters of
[A-Za-z0-9_.-]). pause(tag)
is xseg.sleep(tags=..., offload=[the backup pools' tags]) on every device with such pools,
resume(tag) is xseg.wake(tags=...). cuda_graph() captures with torch.cuda.graph into a graph
pool carrying the same tag.

Where it differs from torch_memory_saver:
- Without enable_cpu_backup, torch_memory_saver leaves whatever the new physical pages held
  after resume (garbage); xseg's discarded pages read zero.
- Pausing what is paused, or resuming what is not paused, makes torch_memory_saver's library
  exit the process; here it raises RuntimeError naming the tag, and nothing changes. A tag with
  no region yet pauses and resumes as a no-op, as there.
- A paused tag's region cannot allocate (xseg refuses allocating from a sleeping pool): entering
  it raises RuntimeError until resume(tag).
- The backup is xseg's pinned host memory; cpu_backup_backend "pinned" and "mmap" are accepted
  (and checked as torch_memory_saver checks them) but both use it. get_cpu_backup(),
  retain_cpu_backup=True, enable_disk_backup and set_disk_backup_dir() are not offered (xseg
  keeps the offloaded bytes inside the library): NotImplementedError saying so.
- hook_mode ("preload" or "torch") is accepted and changes nothing: xseg is PyTorch's allocator
  (xseg.torch.enable()), neither LD_PRELOAD nor a pluggable allocator of this package is needed,
  and cuda_graph() works in either. configure_subprocess() therefore sets no LD_PRELOAD.
- disable() may be entered outside a region too (torch_memory_saver asserts there); its
  allocations go to an untagged pool of their own that is never paused.
- The memory is xseg's expandable segments (torch_memory_saver refuses expandable_segments).
"""
from contextlib import contextmanager

import xseg

from ._backend import TagNames, default_backend

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]

_TAG_DEFAULT = "default"
_HOOK_MODES = ("preload", "torch")
_BACKUP_BACKENDS = ("mmap", "pinned")


class MemoryMarginError(RuntimeError, MemoryError):
    """resume() would leave less free device memory than memory_margin_bytes."""


def _check_tag(func, tag, allow_none):
    if tag is None and allow_none:
        return None
    if not isinstance(tag, str):
        raise TypeError("torch_memory_saver.%s: tag must be a str%s, not %s"
                        % (func, " or None" if allow_none else "", type(tag).__name__))
    if not tag:
        raise ValueError("torch_memory_saver.%s: tag must not be empty" % func)
    return tag


def _check_bool(func, name, value):
    if not isinstance(value, bool):
        raise TypeError("torch_memory_saver.%s: %s must be a bool, not %s"
                        % (func, name, type(value).__name__))


def _check_backup(func, enable_cpu_backup, cpu_backup_backend):
    _check_bool(func, "enable_cpu_backup", enable_cpu_backup)
    if cpu_backup_backend is None:
        return
    if cpu_backup_backend not in _BACKUP_BACKENDS:
        raise ValueError("torch_memory_saver.%s: cpu_backup_backend must be one of %s or None, not %r"
                         % (func, _BACKUP_BACKENDS, cpu_backup_backend))
    if not enable_cpu_backup:
        raise ValueError("torch_memory_saver.%s: cpu_backup_backend requires enable_cpu_backup=True" % func)


class TorchMemorySaver:
    """torch_memory_saver's TorchMemorySaver over xseg (see the module's docstring). `backend`:
    the pools' backend (xseg.compat._backend); None picks torch's when torch imports, at the
    first call that needs one."""

    def __init__(self, backend=None):
        self._backend = backend
        self._initialized = False
        self._hook_mode = "preload"
        self._names = TagNames("tms")
        self._pools = {}     # (tag, backup, device) -> pool
        self._xtags = {}     # (device, xtag) -> [tag, backup, [pools]]
        self._paused = set()  # (device, xtag)
        self._margin = 0

    def _ensure_initialized(self):
        if self._backend is None:
            self._backend = default_backend()
        self._initialized = True
        return self._backend

    def _add_pool(self, tag, backup, device, xtag, pool):
        entry = self._xtags.setdefault((device, xtag), [tag, backup, []])
        if not any(p is pool or p == pool for p in entry[2]):  # a graph pool captured into again
            entry[2].append(pool)

    # --- regions -------------------------------------------------------------------------------

    @contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False,
               cpu_backup_backend=None):
        """Allocations inside go to (tag, enable_cpu_backup)'s pool on the current device:
        pause() gives their memory back, offloading it to pinned host memory when
        enable_cpu_backup, else discarding it (zeros after resume)."""
        _check_tag("region", tag, False)
        _check_backup("region", enable_cpu_backup, cpu_backup_backend)
        _check_bool("region", "enable_disk_backup", enable_disk_backup)
        if enable_cpu_backup and enable_disk_backup:
            raise ValueError("torch_memory_saver.region: enable_cpu_backup and enable_disk_backup "
                             "are mutually exclusive")
        if enable_disk_backup:
            raise NotImplementedError(
                "torch_memory_saver.region: enable_disk_backup is not offered over xseg (its sleep "
                "to a file is per pool: xseg.sleep(pool, path=...)); use enable_cpu_backup=True")
        backend = self._ensure_initialized()
        device = backend.current_device()
        xtag = self._names.xseg_tag(tag, "cpu" if enable_cpu_backup else "")
        if (device, xtag) in self._paused:
            raise RuntimeError("torch_memory_saver.region: tag %r (cpu backup %s) is paused on device "
                               "%d; resume(%r) before allocating in it"
                               % (tag, enable_cpu_backup, device, tag))
        key = (tag, enable_cpu_backup, device)
        pool = self._pools.get(key)
        if pool is None:
            pool = backend.make_pool(xtag, device)
            self._pools[key] = pool
            self._add_pool(tag, enable_cpu_backup, device, xtag, pool)
        with backend.use_pool(pool, device):
            yield

    @contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global",
                   tag=_TAG_DEFAULT, enable_cpu_backup=False, cpu_backup_backend=None):
        """torch.cuda.graph(cuda_graph, pool, stream, capture_error_mode) whose pool is paused
        and resumed with `tag` (offloaded with enable_cpu_backup, else discarded)."""
        _check_tag("cuda_graph", tag, False)
        _check_backup("cuda_graph", enable_cpu_backup, cpu_backup_backend)
        backend = self._ensure_initialized()
        device = backend.current_device()
        xtag = self._names.xseg_tag(tag, "cpu" if enable_cpu_backup else "")
        if (device, xtag) in self._paused:
            raise RuntimeError("torch_memory_saver.cuda_graph: tag %r is paused on device %d; "
                               "resume(%r) before capturing into it" % (tag, device, tag))
        with backend.graph(cuda_graph, pool, stream, capture_error_mode, xtag, device,
                           lambda p: self._add_pool(tag, enable_cpu_backup, device, xtag, p)):
            yield

    @contextmanager
    def disable(self):
        """Allocations inside are never paused: they go to an untagged pool of their own, dropped
        (its memory freed as its tensors go) when the block ends."""
        backend = self._ensure_initialized()
        device = backend.current_device()
        pool = backend.make_pool(None, device)
        try:
            with backend.use_pool(pool, device):
                yield
        finally:
            backend.release_pool(pool, device)
            del pool

    # --- pause and resume ----------------------------------------------------------------------

    def _select(self, tag):
        """{device: [xtag, ...]} of `tag` (None: every tag)."""
        out = {}
        for (device, xtag), (t, _backup, _pools) in sorted(self._xtags.items()):
            if tag is None or t == tag:
                out.setdefault(device, []).append(xtag)
        return out

    def pause(self, tag=None):
        """Give back the memory of `tag`'s regions (None: every region), on every device; the
        backup regions' bytes wait in pinned host memory. Raises RuntimeError, changing nothing,
        when any of them is paused already."""
        _check_tag("pause", tag, True)
        sel = self._select(tag)
        paused = sorted(self._xtags[(d, x)][0] for d, xs in sel.items() for x in xs if (d, x) in self._paused)
        if paused:
            raise RuntimeError("torch_memory_saver.pause(tag=%r): %s already paused (resume first)"
                               % (tag, ", ".join(repr(t) for t in sorted(set(paused)))))
        for device, xtags in sel.items():
            keep = [x for x in xtags if self._xtags[(device, x)][1]]
            xseg.sleep(tags=xtags, offload=keep, device=device)
            self._paused.update((device, x) for x in xtags)

    def resume(self, tag=None):
        """Map `tag`'s regions again (None: every region) at their addresses: backup regions get
        their bytes back, the others read zero. Raises RuntimeError, changing nothing, when any of
        them is not paused; MemoryMarginError when fewer than memory_margin_bytes would stay free;
        xseg.XsegOutOfMemoryError when the memory is not there (they stay paused)."""
        _check_tag("resume", tag, True)
        sel = self._select(tag)
        active = sorted(self._xtags[(d, x)][0] for d, xs in sel.items() for x in xs if (d, x) not in self._paused)
        if active:
            raise RuntimeError("torch_memory_saver.resume(tag=%r): %s not paused"
                               % (tag, ", ".join(repr(t) for t in sorted(set(active)))))
        for device, xtags in sel.items():
            if self._margin:
                need = sum(xseg.sleep_stats(p, device)["released_bytes"]
                           for x in xtags for p in self._xtags[(device, x)][2])
                free = xseg.mem_get_info(device)[0]
                if free < need + self._margin:
                    raise MemoryMarginError(
                        "torch_memory_saver.resume(tag=%r): device %d has %d bytes free, the regions "
                        "need %d and memory_margin_bytes keeps %d" % (tag, device, free, need, self._margin))
            try:
                xseg.wake(tags=xtags, device=device)
            finally:
                # A failed wake leaves the tags before the failing one awake: ask xseg which.
                for x in xtags:
                    if not any(xseg.sleep_stats(p, device)["asleep"] for p in self._xtags[(device, x)][2]):
                        self._paused.discard((device, x))

    # --- settings ------------------------------------------------------------------------------

    @property
    def enabled(self):
        return True

    @property
    def hook_mode(self):
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, hook_mode):
        if self._initialized:
            raise RuntimeError("torch_memory_saver.hook_mode: cannot configure after initialization")
        if hook_mode not in _HOOK_MODES:
            raise ValueError("torch_memory_saver.hook_mode must be one of %s, not %r" % (_HOOK_MODES, hook_mode))
        self._hook_mode = hook_mode

    @property
    def memory_margin_bytes(self):
        return self._margin

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("torch_memory_saver.memory_margin_bytes must be an int, not %s" % type(value).__name__)
        if value < 0:
            raise ValueError("torch_memory_saver.memory_margin_bytes must be >= 0, got %d" % value)
        self._margin = value

    @property
    def retain_cpu_backup(self):
        return False

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        _check_bool("retain_cpu_backup", "value", value)
        if value:
            raise NotImplementedError("torch_memory_saver.retain_cpu_backup=True is not offered over "
                                      "xseg: a wake frees the pinned copy it restored from")

    def get_cpu_backup(self, x, zero_copy=False):
        raise NotImplementedError("torch_memory_saver.get_cpu_backup is not offered over xseg: the "
                                  "offloaded bytes stay inside the library until resume()")

    def set_disk_backup_dir(self, path):
        raise NotImplementedError("torch_memory_saver.set_disk_backup_dir is not offered over xseg "
                                  "(enable_disk_backup is not); xseg.sleep(pool, path=...) sleeps one "
                                  "pool to a file")


@contextmanager
def configure_subprocess():
    """torch_memory_saver's helper that puts its LD_PRELOAD library in the environment of the
    processes started inside the block. xseg needs no preload (a subprocess reaches xseg through
    the sitecustomize.py on its inherited PYTHONPATH, docs/guide.md), so the environment is left
    as it is."""
    yield


torch_memory_saver = TorchMemorySaver()
"""The process's singleton, as torch_memory_saver's."""
