"""vLLM's KV-connector check against expandable segments, answered by xseg (issue 76 item 4).

StandInVllmConfig._verify_kv_transfer_compat ports the logic (not the text) of vLLM's check:
vllm-project/vllm, vllm/config/vllm.py, VllmConfig._verify_kv_transfer_compat, at commit
000fc94b754f66aeb60ef5acf1ea2e94cdc65164 (the check PR #41237 added, merged 2026-04-29, moved
there from KVTransferConfig.__post_init__). Its rule: a configured KV connector with
"expandable_segments:True" in PYTORCH_CUDA_ALLOC_CONF is refused (ValueError) unless the model
config enables the CuMem allocator.

The recipe (docs/guide.md, "vLLM with a KV connector"): xseg.torch.enable() and
xseg.compat.vllm_kv.install() (or the vllm.general_plugins entry point with
XSEG_VLLM_KV_CONNECTOR=1). Under it the check passes where xseg.registration_safe() says safe,
and still refuses where it says unsafe (spill_to_host:True, expandable_segments_defrag:True) or
where xseg is not the allocator.
"""
import os
import sys
import types

import pytest


class _KV:
    def __init__(self, connector):
        self.kv_connector = connector


class _Model:
    def __init__(self, cumem):
        self.enable_cumem_allocator = cumem


class StandInVllmConfig:
    """The two fields vLLM's check reads, and the check's logic."""

    def __init__(self, connector="NixlConnector", cumem=False):
        self.kv_transfer_config = None if connector is None else _KV(connector)
        self.model_config = _Model(cumem)

    def _verify_kv_transfer_compat(self):
        kv = self.kv_transfer_config
        if kv is None or kv.kv_connector is None:
            return  # no connector: nothing registers the KV cache
        if "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            return  # no VMM remapping to fear
        if self.model_config is not None and self.model_config.enable_cumem_allocator:
            return  # the CuMem pool keeps the KV cache on fixed pages
        raise ValueError("KV connector %s refused with expandable segments: the allocator may remap "
                         "registered KV memory" % kv.kv_connector)


@pytest.fixture
def recipe(xseg, monkeypatch):
    from xseg.compat import vllm_kv
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    xseg.set_config("expandable_segments:True,spill_to_host:False,expandable_segments_defrag:False")
    cls = type("VllmConfig", (StandInVllmConfig,), {"_verify_kv_transfer_compat":
                                                    StandInVllmConfig._verify_kv_transfer_compat})
    yield vllm_kv, cls
    vllm_kv.uninstall(cls)
    xseg.set_config("expandable_segments:True,spill_to_host:False,expandable_segments_defrag:False")


def test_the_port_refuses_as_vllm_does(recipe, monkeypatch):
    _, cls = recipe
    with pytest.raises(ValueError, match="NixlConnector"):
        cls()._verify_kv_transfer_compat()
    cls(cumem=True)._verify_kv_transfer_compat()
    cls(connector=None)._verify_kv_transfer_compat()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    cls()._verify_kv_transfer_compat()


def test_the_recipe_passes_where_xseg_is_safe(recipe):
    vllm_kv, cls = recipe
    vllm_kv.install(cls, is_allocator=lambda: True)
    vllm_kv.install(cls, is_allocator=lambda: True)  # idempotent
    import xseg
    assert xseg.registration_safe()[0]
    cls()._verify_kv_transfer_compat()  # NixlConnector with expandable segments: allowed
    cls(connector="MooncakeConnectorV1")._verify_kv_transfer_compat()


@pytest.mark.parametrize("key", ["spill_to_host", "expandable_segments_defrag"])
def test_the_recipe_still_refuses_where_xseg_is_unsafe(recipe, key):
    vllm_kv, cls = recipe
    vllm_kv.install(cls, is_allocator=lambda: True)
    import xseg
    xseg.set_config("%s:True" % key)
    assert not xseg.registration_safe()[0]
    with pytest.raises(ValueError) as ei:
        cls()._verify_kv_transfer_compat()
    assert "NixlConnector" in str(ei.value) and key + ":True" in str(ei.value)


def test_the_recipe_refuses_when_xseg_is_not_the_allocator(recipe):
    vllm_kv, cls = recipe
    vllm_kv.install(cls, is_allocator=lambda: False)
    with pytest.raises(ValueError, match="xseg.torch.enable"):
        cls()._verify_kv_transfer_compat()
    vllm_kv.uninstall(cls)
    vllm_kv.install(cls)  # the default question: xseg.torch.enable() has not run in this process
    with pytest.raises(ValueError, match="not PyTorch's allocator"):
        cls()._verify_kv_transfer_compat()


def test_the_plugin_entry_point(recipe, monkeypatch):
    """register() (group vllm.general_plugins) installs into vllm.config.vllm.VllmConfig, only
    when XSEG_VLLM_KV_CONNECTOR=1."""
    vllm_kv, cls = recipe
    pkg, sub, mod = (types.ModuleType(n) for n in ("vllm", "vllm.config", "vllm.config.vllm"))
    mod.VllmConfig = cls
    for name, m in (("vllm", pkg), ("vllm.config", sub), ("vllm.config.vllm", mod)):
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.delenv(vllm_kv.ENV, raising=False)
    vllm_kv.register()
    assert "_verify_kv_transfer_compat" in cls.__dict__ and not hasattr(cls._verify_kv_transfer_compat,
                                                                        "_xseg_kv_original")
    monkeypatch.setenv(vllm_kv.ENV, "1")
    vllm_kv.register()
    assert hasattr(cls._verify_kv_transfer_compat, "_xseg_kv_original")
    monkeypatch.setattr(vllm_kv, "allocator_is_xseg", lambda: True)
    cls()._verify_kv_transfer_compat()
