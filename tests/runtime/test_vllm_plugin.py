"""The vLLM plugin's ``register()``: vLLM calls it in every process, for every model, so it never raises."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from ladderize.runtime.vllm import plugin


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, register_model) -> dict:
    """A stand-in ``vllm`` package with a ModelRegistry and MODELS_CONFIG_MAP (the two names register() uses)."""
    registry, config_map = {}, {}
    vllm = types.ModuleType("vllm")
    vllm.ModelRegistry = types.SimpleNamespace(
        get_supported_archs=lambda: list(registry), register_model=lambda arch, path: register_model(registry, arch, path)
    )
    config = types.ModuleType("vllm.model_executor.models.config")
    config.MODELS_CONFIG_MAP = config_map
    for name in ("vllm.model_executor", "vllm.model_executor.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.model_executor.models.config", config)
    return {"registry": registry, "config_map": config_map}


def test_register_registers_the_architecture_once(monkeypatch):
    state = _fake_vllm(monkeypatch, lambda registry, arch, path: registry.__setitem__(arch, path))
    plugin.register()
    plugin.register()  # idempotent: vLLM calls it in every process, sometimes twice in one
    assert state["registry"] == {plugin.ARCHITECTURE: plugin.MODEL_PATH}
    assert state["config_map"][plugin.ARCHITECTURE] is plugin.LadderConfigCheck


def test_register_never_raises_and_warns_in_one_line(monkeypatch, caplog):
    def broken(registry, arch, path):
        raise RuntimeError("registry is closed\nsecond line")

    _fake_vllm(monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "ladderize: vLLM plugin not registered, ladder_llama checkpoints will not serve (RuntimeError: registry is closed)"
    )


def test_register_without_vllm_importable_warns(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm fails
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
    assert "vLLM plugin not registered" in caplog.text and "\n" not in caplog.records[0].getMessage()
