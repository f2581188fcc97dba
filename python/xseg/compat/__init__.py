"""Engines switch to xseg's sleep and wake by import.

- xseg.compat.torch_memory_saver: torch_memory_saver's API (SGLang, verl, slime).
- xseg.compat.vllm: vLLM's CuMemAllocator (vllm.device_allocator.cumem).
- xseg.compat.vllm_kv: vLLM's KV-connector check against expandable segments asks
  xseg.registration_safe() (install(), or the vllm.general_plugins entry point register()).

install_aliases() makes `import torch_memory_saver` give the first and
`from vllm.device_allocator.cumem import CuMemAllocator` give the second's names, while vLLM
itself still imports. Call it from a sitecustomize.py on PYTHONPATH, so that every process an
engine starts (its workers too, which inherit the environment) has it before the engine imports:

    # sitecustomize.py
    import xseg.torch, xseg.compat
    xseg.torch.enable()
    xseg.compat.install_aliases()

sitecustomize_example() returns that file's text (docs/guide.md has the recipes).
"""
import importlib.abc
import importlib.util
import sys

__all__ = ["install_aliases", "uninstall_aliases", "sitecustomize_example", "ALIASES"]

ALIASES = {
    "torch_memory_saver": "xseg.compat.torch_memory_saver",
    "vllm.device_allocator.cumem": "xseg.compat.vllm",
}
"""The module names install_aliases() answers, and the compat module each gets."""


class _AliasLoader(importlib.abc.Loader):
    """Makes the aliased module a module of its own name whose names are the compat module's
    (the same objects: CuMemAllocator is xseg.compat.vllm.CuMemAllocator)."""

    def __init__(self, target):
        self._target = target

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        src = importlib.import_module(self._target)
        names = getattr(src, "__all__", None) or [n for n in vars(src) if not n.startswith("_")]
        for n in names:
            setattr(module, n, getattr(src, n))
        module.__doc__ = src.__doc__
        module.__all__ = list(names)
        module.__xseg_compat__ = self._target


class _AliasFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: answers only the names in ALIASES; every other import (vllm and
    vllm.device_allocator themselves) goes on to the real finders."""

    def find_spec(self, fullname, path=None, target=None):
        target_name = ALIASES.get(fullname)
        if target_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name))


_finder = None


def install_aliases():
    """Answer the names of ALIASES with xseg's compat modules from now on (idempotent). A name
    imported already (the real torch_memory_saver, vLLM's cumem) is dropped from sys.modules so
    that the next import gets xseg's; objects taken from it before stay the real ones, so call
    this before the engine imports (sitecustomize.py)."""
    global _finder
    if _finder is None:
        _finder = _AliasFinder()
        sys.meta_path.insert(0, _finder)
    for name in ALIASES:
        mod = sys.modules.get(name)
        if mod is not None and not getattr(mod, "__xseg_compat__", None):
            del sys.modules[name]


def uninstall_aliases():
    """Undo install_aliases(): the real modules answer the next imports of those names."""
    global _finder
    if _finder is not None:
        sys.meta_path.remove(_finder)
        _finder = None
    for name in ALIASES:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__xseg_compat__", None):
            del sys.modules[name]


_SITECUSTOMIZE = '''\
# sitecustomize.py: on PYTHONPATH, so that every Python process (an engine's workers too) runs it
# at start. xseg becomes PyTorch's allocator, and torch_memory_saver / vLLM's CuMemAllocator
# become xseg's sleep and wake by tag.
import xseg.compat
try:
    import xseg.torch
    xseg.torch.enable()
except ImportError:  # a process without torch (a launcher) needs no allocator
    pass
xseg.compat.install_aliases()
'''


def sitecustomize_example():
    """The text of a sitecustomize.py that switches an engine to xseg (see the module's
    docstring)."""
    return _SITECUSTOMIZE
