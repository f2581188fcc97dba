"""vLLM's CuMemAllocator (vllm.device_allocator.cumem) over xseg's sleep by tag.

Re-implemented (no code or prose copied) from vllm-project/vllm, vllm/device_allocator/cumem.py
at commit 010c211270c004db49f91933849804821d153e4d (the version the source index held), with the
assertions of tests/basic_correctness/test_cumem.py at 04a070dc088c6cd86299a19dab64195ed8e209a8.
vLLM switches by import: xseg.compat.install_aliases() makes `vllm.device_allocator.cumem` this
module's names while vLLM itself still imports (docs/guide.md).

    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        model = load()
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.empty(...)
    allocator.sleep(offload_tags=("weights",))    # level 1: weights kept, KV cache discarded
    allocator.wake_up(tags=["weights"])           # RL: update the weights first...
    allocator.wake_up(tags=["kv_cache"])          # ...then the KV cache (zeros)
    allocator.discard("kv_cache")                 # drop the KV cache alone (e.g. to resize it)

How it maps: each (tag, device) has one private pool (a torch.cuda.MemPool entered with
torch.cuda.use_mem_pool; vLLM makes a new MemPool over its pluggable allocator at each entry)
carrying the xseg tag vllm.TAG (vllm-N when TAG has a '.' or does not fit xseg's 31 characters
of [A-Za-z0-9_.-]). sleep() is xseg.sleep(tags=every pool's tag, offload=offload_tags') on each
device, wake_up(tags) xseg.wake(tags=...).

Where it differs from vLLM:
- Discarded memory reads zero after wake_up (vLLM: whatever the new pages held).
- Sleeping what sleeps and waking what is awake are left alone, as vLLM's allocators do since
  they track each allocation's state (AllocationData.is_asleep; discard(tags), which drops
  awake tags' memory without a backup, came with it; seen in stored vLLM versions newer than the
  cumem.py followed, vllm/device_allocator/__init__.py's MemAllocator protocol and xpumem.py):
  sleep() keeps an asleep pool's earlier offload-or-discard choice and warns where offload_tags
  asks otherwise. Tags without a pool are ignored, as in vLLM. (At 010c211 itself a second
  sleep or wake fails part way in vLLM's C extension.)
- A failed wake_up (the memory is not there) raises RuntimeError (xseg.XsegOutOfMemoryError is
  one); the pools not yet woken stay asleep and can be woken later, as vLLM's rollback leaves
  them.
- Allocating in a sleeping tag's pool is refused at use_memory_pool(): RuntimeError.
- Not offered: the CUDA graph pool of the newest vLLM (cudagraph_tag, use_cudagraph_pool,
  release_cudagraph_pool), whose cumem.py was not available here; graphs captured with
  torch.cuda.graph stay in PyTorch's graph pools, as with vLLM's use_memory_pool.
- get_current_usage() is the memory the pools hold (their segments' mapped bytes, as vLLM counts
  the bytes its pluggable allocator handed out); while asleep it is what they will hold again.
- Expandable segments are what xseg sleeps: use_memory_pool() never turns them off.
"""
import warnings
from contextlib import contextmanager

import xseg

from ._backend import TagNames, default_backend

__all__ = ["CuMemAllocator", "cumem_available"]

cumem_available = True
"""vLLM's flag that its cumem extension loaded; xseg's sleep needs none."""


def _tag_tuple(func, name, tags):
    if isinstance(tags, str):
        return (tags,)
    try:
        out = tuple(tags)
    except TypeError:
        raise TypeError("CuMemAllocator.%s: %s must be a str or a sequence of str, not %s"
                        % (func, name, type(tags).__name__)) from None
    bad = [t for t in out if not isinstance(t, str)]
    if bad:
        raise TypeError("CuMemAllocator.%s: %s must hold only str, got %r" % (func, name, bad[0]))
    return out


class CuMemAllocator:
    """vLLM's CuMemAllocator over xseg (see the module's docstring): a singleton, get_instance()."""

    instance = None
    default_tag = "default"

    @staticmethod
    def get_instance():
        """The process's allocator (made at the first call)."""
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    def __init__(self, backend=None):
        """`backend`: the pools' backend (xseg.compat._backend); None picks torch's when torch
        imports, at the first use_memory_pool()."""
        self._backend = backend
        self._names = TagNames("vllm")
        self._pools = {}     # (tag, device) -> (xtag, pool)
        self._asleep = {}  # (tag, device) -> True: offloaded, False: discarded
        self._slept_bytes = {}  # (tag, device) -> bytes its pool held when put to sleep
        self.current_tag = CuMemAllocator.default_tag

    def _tags_on(self, device):
        return {t: xp for (t, d), xp in self._pools.items() if d == device}

    def _devices(self):
        return sorted({d for (_t, d) in self._pools})

    @contextmanager
    def use_memory_pool(self, tag=None):
        """Allocations inside go to `tag`'s pool (None: default_tag) on the current device."""
        if tag is None:
            tag = CuMemAllocator.default_tag
        if not isinstance(tag, str):
            raise TypeError("CuMemAllocator.use_memory_pool: tag must be a str or None, not %s"
                            % type(tag).__name__)
        if not tag:
            raise ValueError("CuMemAllocator.use_memory_pool: tag must not be empty")
        if self._backend is None:
            self._backend = default_backend()
        backend = self._backend
        device = backend.current_device()
        if (tag, device) in self._asleep:
            raise RuntimeError("CuMemAllocator.use_memory_pool: tag %r sleeps on device %d; "
                               "wake_up(tags=[%r]) before allocating in it" % (tag, device, tag))
        entry = self._pools.get((tag, device))
        if entry is None:
            xtag = self._names.xseg_tag(tag)
            entry = (xtag, backend.make_pool(xtag, device))
            self._pools[(tag, device)] = entry
        old = self.current_tag
        self.current_tag = tag
        try:
            with backend.use_pool(entry[1], device):
                yield
        finally:
            self.current_tag = old

    def _sleep(self, device, names, keep):
        """Sleep the awake pools of `names` on `device`, offloading those in `keep`."""
        on = self._tags_on(device)
        held = self._pool_bytes(device)
        xseg.sleep(tags=[on[t][0] for t in names], offload=[on[t][0] for t in names if t in keep],
                   device=device)
        for t in names:
            self._asleep[(t, device)] = t in keep
            self._slept_bytes[(t, device)] = held.get(t, 0)

    def sleep(self, offload_tags=None):
        """Give back every awake pool's device memory: the pools of `offload_tags` (None:
        default_tag) keep their bytes in pinned host memory, the others are discarded. Pools
        asleep already (an earlier sleep() or discard()) are left as they are, keeping their
        earlier choice (a warning says so where offload_tags asks otherwise)."""
        keep = (CuMemAllocator.default_tag,) if offload_tags is None else \
            _tag_tuple("sleep", "offload_tags", offload_tags)
        conflicts = set()
        for device in self._devices():
            on = self._tags_on(device)
            conflicts.update(t for t in on if (t, device) in self._asleep and self._asleep[(t, device)] != (t in keep))
            awake = [t for t in sorted(on) if (t, device) not in self._asleep]
            if awake:
                self._sleep(device, awake, keep)
        if conflicts:
            warnings.warn("CuMemAllocator.sleep: %s asleep already; the earlier offload or discard is kept"
                          % ", ".join(repr(t) for t in sorted(conflicts)), stacklevel=2)
        if self._backend is not None:
            self._backend.empty_cache()  # as vLLM: the default pools' cache goes back too

    def discard(self, tags):
        """Give back the device memory of the awake pools of `tags` (a str or a sequence of them),
        their bytes dropped (zeros after wake_up); the other pools stay awake. Pools asleep
        already are left as they are (a warning where one was offloaded)."""
        names = _tag_tuple("discard", "tags", tags)
        conflicts = set()
        for device in self._devices():
            on = self._tags_on(device)
            conflicts.update(t for t in names if self._asleep.get((t, device)))
            awake = [t for t in names if t in on and (t, device) not in self._asleep]
            if awake:
                self._sleep(device, list(dict.fromkeys(awake)), ())
        if conflicts:
            warnings.warn("CuMemAllocator.discard: %s asleep already, offloaded; kept so"
                          % ", ".join(repr(t) for t in sorted(conflicts)), stacklevel=2)

    def wake_up(self, tags=None):
        """Map the sleeping pools again at their addresses (None: all of them; else those of
        `tags`, in that order): offloaded bytes come back, discarded ones read zero. Awake pools
        and tags without a pool are left alone."""
        want = None if tags is None else _tag_tuple("wake_up", "tags", tags)
        for device in self._devices():
            on = self._tags_on(device)
            order = sorted(on) if want is None else list(dict.fromkeys(t for t in want if t in on))
            order = [t for t in order if (t, device) in self._asleep]
            if not order:
                continue
            try:
                xseg.wake(tags=[on[t][0] for t in order], device=device)
            finally:
                # A failed wake leaves the tags before the failing one awake: ask xseg which.
                for t in order:
                    if not xseg.sleep_stats(on[t][1], device)["asleep"]:
                        del self._asleep[(t, device)]

    def _pool_bytes(self, device):
        """{tag: bytes its awake pool maps on `device`} from xseg's snapshot."""
        pools = {}
        for (t, d), (_x, pool) in self._pools.items():
            if d == device:
                pid = pool.id if hasattr(pool, "id") and not isinstance(pool, tuple) else pool
                pools[(int(pid[0]), int(pid[1]))] = t
        out = dict.fromkeys(pools.values(), 0)
        for seg in xseg.memory_snapshot(device):
            t = pools.get(tuple(seg.get("segment_pool_id", (0, 0))))
            if t is not None:
                out[t] += seg["total_size"]
        return out

    def get_current_usage(self):
        """Bytes the pools hold on the device (their segments' bytes), summed over tags and
        devices; a sleeping pool counts what it held when put to sleep."""
        total = 0
        for device in self._devices():
            for t, n in self._pool_bytes(device).items():
                total += self._slept_bytes.get((t, device), 0) if (t, device) in self._asleep else n
        return total
