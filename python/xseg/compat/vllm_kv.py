"""vLLM with a KV connector and expandable memory, xseg as the allocator (issue 76).

vLLM refuses a KV connector (NIXL, Mooncake, any other) whenever PYTORCH_CUDA_ALLOC_CONF holds
expandable_segments:True and the CuMem allocator is off (vllm-project/vllm#41237,
VllmConfig._verify_kv_transfer_compat in vllm/config/vllm.py): PyTorch's VMM allocator could
remap the KV cache's addresses to other physical pages under the NIC's registration. With xseg
as the allocator that is a question xseg answers: xseg.registration_safe() says whether anything
xseg does on its own could change the pages under a live block in the configuration in force
(docs/registrations.md). This module makes vLLM's check ask it:

- install() wraps VllmConfig._verify_kv_transfer_compat: where vLLM's own check refuses, the
  configuration passes when xseg is PyTorch's allocator in this process (xseg.torch.enable ran)
  and xseg.registration_safe() answers safe; otherwise vLLM's refusal stands, with xseg's reason
  added (e.g. spill_to_host:True).
- register() is the vllm.general_plugins entry point: it installs when XSEG_VLLM_KV_CONNECTOR=1
  (a plugin vLLM loads in every process does nothing unasked). Without packaging, call install()
  from a sitecustomize.py after xseg.torch.enable() (docs/guide.md, "vLLM with a KV connector").
"""
import os

import xseg

__all__ = ["ENV", "install", "uninstall", "register", "check", "allocator_is_xseg"]

ENV = "XSEG_VLLM_KV_CONNECTOR"
"""register() installs only when this is "1"."""

_MARK = "_xseg_kv_original"


def allocator_is_xseg():
    """True when xseg is PyTorch's CUDA allocator in this process (xseg.torch.enable ran)."""
    try:
        import xseg.torch as xt
    except ImportError:
        return False
    return xt.is_enabled()


def check(is_allocator=None):
    """(ok, reason): may a KV connector register xseg's memory with expandable segments on?
    ok only when xseg is the allocator and xseg.registration_safe() says so."""
    is_allocator = allocator_is_xseg if is_allocator is None else is_allocator
    if not is_allocator():
        return False, "xseg is not PyTorch's allocator in this process (call xseg.torch.enable() first)"
    return xseg.registration_safe()


def _vllm_config_class():
    from vllm.config.vllm import VllmConfig
    return VllmConfig


def install(config_class=None, is_allocator=None):
    """Wrap config_class._verify_kv_transfer_compat (vLLM's VllmConfig by default). Idempotent."""
    cls = _vllm_config_class() if config_class is None else config_class
    original = cls.__dict__.get("_verify_kv_transfer_compat")
    if original is None:
        raise AttributeError("%s has no _verify_kv_transfer_compat: this vLLM has no such check" % cls.__name__)
    if getattr(original, _MARK, None) is not None:
        return

    def _verify_kv_transfer_compat(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except ValueError as refusal:
            ok, why = check(is_allocator)
            if ok:
                return None  # xseg keeps the pages of a live block put: the connector may register
            raise ValueError("%s [xseg: %s]" % (refusal, why)) from refusal

    setattr(_verify_kv_transfer_compat, _MARK, original)
    _verify_kv_transfer_compat.__doc__ = original.__doc__
    cls._verify_kv_transfer_compat = _verify_kv_transfer_compat


def uninstall(config_class=None):
    """Undo install()."""
    cls = _vllm_config_class() if config_class is None else config_class
    wrapped = cls.__dict__.get("_verify_kv_transfer_compat")
    original = getattr(wrapped, _MARK, None)
    if original is not None:
        cls._verify_kv_transfer_compat = original


def register():
    """vLLM's general plugin entry point (group vllm.general_plugins): install() when
    XSEG_VLLM_KV_CONNECTOR=1, else nothing."""
    if os.environ.get(ENV) == "1":
        install()
