"""vllm_foundry.config.uses_v2_runner: which GPU model runner a vLLM release runs."""

import importlib.util
import types

from vllm_foundry import config, modes


def test_a_named_choice_wins_worker_first():
    assert config.uses_v2_runner(types.SimpleNamespace(use_v2_model_runner=True)) is True
    assert config.uses_v2_runner(types.SimpleNamespace(use_v2_model_runner=False)) is False
    worker = types.SimpleNamespace(use_v2_model_runner=False)
    assert config.uses_v2_runner(types.SimpleNamespace(use_v2_model_runner=True), worker) is False


def test_without_the_attribute_v2_is_the_only_runner_once_v1_is_gone(monkeypatch):
    # vLLM 0.34.0: no use_v2_model_runner anywhere, and no V1 runner module.
    specs = {}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: specs.get(name))
    newest = types.SimpleNamespace()
    assert config.uses_v2_runner(newest, types.SimpleNamespace()) is True
    assert not any("V1 model runner" in p for p in modes.unsupported_settings(newest))
    # A release that still ships the V1 module but names no choice: V1, refused as before.
    specs[config.V1_RUNNER_MODULE] = object()
    assert config.uses_v2_runner(newest) is False
    assert any("V1 model runner" in p for p in modes.unsupported_settings(newest))


def test_without_vllm_installed_the_old_default_stays(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec", missing)
    assert config.uses_v2_runner(types.SimpleNamespace()) is False
