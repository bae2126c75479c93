"""vllm-foundry's compile_key.py: the host paths in vLLM's compile-cache key recorded at SAVE and
matched at LOAD, so that a LOAD at other cache or home directories finds the archive's compiled model."""

from __future__ import annotations

import logging
import os
import sys
import types

import pytest

from vllm_foundry import compile_key


def _envs(xla: str, config: str) -> types.SimpleNamespace:
    # vLLM's envs module as the plugin reads it: each variable's value, defaults applied.
    return types.SimpleNamespace(VLLM_XLA_CACHE_PATH=xla, VLLM_CONFIG_ROOT=config)


SAVED = _envs("/root/.cache/vllm/xla_cache", "/root/.config/vllm")


def _recorded() -> dict:
    state: dict = {"kv_cache_bytes": 1}
    compile_key.record(state, SAVED)
    return state


def test_save_records_the_paths_vllm_hashes():
    assert _recorded()[compile_key.STATE_KEY] == {"VLLM_XLA_CACHE_PATH": "/root/.cache/vllm/xla_cache",
                                                   "VLLM_CONFIG_ROOT": "/root/.config/vllm"}


def test_save_records_the_values_its_key_hashed():
    # A LOAD that took SAVE's values and then fell back to SAVE compiled under those.
    state: dict = {}
    compile_key.record(state, _envs("/data/xla", "/home/u/.config/vllm"),
                       {"VLLM_CONFIG_ROOT": ("/root/.config/vllm", "/home/u/.config/vllm")})
    assert state[compile_key.STATE_KEY] == {"VLLM_XLA_CACHE_PATH": "/data/xla", "VLLM_CONFIG_ROOT": "/root/.config/vllm"}


XLA = ("/root/.cache/vllm/xla_cache", "/data/cache/vllm/xla_cache")  # (SAVE's, this host's)
CONFIG = ("/root/.config/vllm", "/home/u/.config/vllm")


@pytest.mark.parametrize("here, expected", [
    (_envs(XLA[1], CONFIG[0]), {"VLLM_XLA_CACHE_PATH": XLA}),
    (_envs(XLA[0], CONFIG[1]), {"VLLM_CONFIG_ROOT": CONFIG}),
    (_envs(XLA[1], CONFIG[1]), {"VLLM_XLA_CACHE_PATH": XLA, "VLLM_CONFIG_ROOT": CONFIG}),
])
def test_load_at_other_paths_finds_what_differs_and_changes_no_variable(monkeypatch, here, expected):
    monkeypatch.delenv("VLLM_XLA_CACHE_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIG_ROOT", raising=False)
    assert compile_key.match(_recorded(), here) == expected
    assert "VLLM_XLA_CACHE_PATH" not in os.environ and "VLLM_CONFIG_ROOT" not in os.environ  # vLLM uses its own


def test_the_log_names_saves_value_and_this_hosts(caplog):
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        compile_key.say_keyed({"VLLM_CONFIG_ROOT": CONFIG})
    assert f"takes SAVE's VLLM_CONFIG_ROOT={CONFIG[0]} ({CONFIG[1]} here)" in caplog.text


def test_the_same_paths_change_nothing():
    assert compile_key.match(_recorded(), SAVED) == {}


def test_an_archive_without_the_record_changes_nothing():
    assert compile_key.match({"kv_cache_bytes": 1}, _envs("/x", "/y")) == {}


def test_a_vllm_that_leaves_the_paths_out_of_its_key_changes_nothing():
    envs = _envs(XLA[1], CONFIG[1])
    envs.compile_factors = lambda: {"VLLM_USE_AOT_COMPILE": "1"}  # vLLM 0.34 ignores both paths
    assert compile_key.match(_recorded(), envs) == {}


def test_a_vllm_that_hashes_one_of_them_is_matched_for_that_one():
    envs = _envs(XLA[1], CONFIG[1])
    envs.compile_factors = lambda: {"VLLM_XLA_CACHE_PATH": XLA[1], "VLLM_USE_AOT_COMPILE": "1"}
    assert compile_key.match(_recorded(), envs) == {"VLLM_XLA_CACHE_PATH": XLA}


def test_the_wrapped_factors_hash_saves_values_and_nothing_else():
    def compile_factors():
        return {"VLLM_XLA_CACHE_PATH": "/data/xla", "VLLM_USE_AOT_COMPILE": "1"}

    wrapped = compile_key.keyed_as_at_save({"VLLM_XLA_CACHE_PATH": ("/root/xla", "/data/xla"),
                                            "VLLM_CONFIG_ROOT": ("/root/c", "/data/c")})(compile_factors)
    # A path the key does not hash stays out of it: the key is SAVE's, not a new one.
    assert wrapped() == {"VLLM_XLA_CACHE_PATH": "/root/xla", "VLLM_USE_AOT_COMPILE": "1"}


# ---- the worker runtime: recorded at SAVE, matched at LOAD, before vLLM computes its key ------------------


class _Session:
    def __init__(self, mode, state=None):
        self.mode = self.requested = mode
        self.state = state

    def recorded_state(self):
        return self.state


def _runtime(monkeypatch, mode, state=None, carried=("torch_compile_cache/torch_aot_compile/h/rank_0_0/model",)):
    """vllm-foundry's WorkerRuntime over a session in ``mode``; its core carrying replaced by an
    archive whose vLLM compile-cache tree holds ``carried``."""
    from foundry_core.engine import worker
    from vllm_foundry import compile_cache, runtime

    def carry_in(rt):
        rt.carried_in = types.SimpleNamespace(paths=lambda cache, prefix="": [
            p for p in carried if p.startswith(prefix)] if cache == compile_cache.CACHE else [])

    monkeypatch.setattr(worker.WorkerRuntime, "carry_caches_in", carry_in)
    return runtime.WorkerRuntime(_Session(mode, state), types.SimpleNamespace(state={}))


def _vllm_envs(monkeypatch, envs):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(envs=envs, __path__=[]))
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)


def _factors(xla: str, config: str) -> types.SimpleNamespace:
    # vLLM 0.25's envs module: the two paths, and compile_factors() hashing them from this host.
    envs = _envs(xla, config)
    envs.compile_factors = lambda: {"VLLM_XLA_CACHE_PATH": xla, "VLLM_CONFIG_ROOT": config, "VLLM_USE_AOT_COMPILE": "1"}
    return envs


@pytest.fixture
def unwrapped():
    from vllm_foundry import patching

    yield
    patching.uninstall_all()


@pytest.mark.parametrize("carried, keyed", [
    (("torch_compile_cache/torch_aot_compile/h/rank_0_0/model", "modelinfos/m.json"), True),
    (("modelinfos/m.json",), False),  # the model-class inspection alone: no compiled model to find
    ((), False),
])
def test_a_save_then_a_load_at_other_paths_hashes_saves_key(monkeypatch, unwrapped, carried, keyed):
    from foundry_core.engine import Mode

    monkeypatch.delenv("VLLM_XLA_CACHE_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIG_ROOT", raising=False)
    save_envs = _factors("/root/.cache/vllm/xla_cache", "/root/.config/vllm")
    _vllm_envs(monkeypatch, save_envs)
    save = _runtime(monkeypatch, Mode.SAVE)
    save.carry_caches_in()
    assert save.adapter.state[compile_key.STATE_KEY]["VLLM_CONFIG_ROOT"] == "/root/.config/vllm"

    load_envs = _factors("/data/cache/vllm/xla_cache", "/home/u/.config/vllm")
    _vllm_envs(monkeypatch, load_envs)
    load = _runtime(monkeypatch, Mode.LOAD, types.SimpleNamespace(adapter=save.adapter.state), carried)
    load.carry_caches_in()
    # Only where the archive carries vLLM's compiled model: else the host's own cache keeps its key.
    assert (load_envs.compile_factors() == save_envs.compile_factors()) is keyed
    assert load_envs.VLLM_CONFIG_ROOT == "/home/u/.config/vllm"  # what vLLM itself reads is this host's
    assert "VLLM_XLA_CACHE_PATH" not in os.environ and "VLLM_CONFIG_ROOT" not in os.environ
    # What a LOAD that falls back to SAVE records: the values its key hashed.
    assert load.adapter.state[compile_key.STATE_KEY] == (
        save.adapter.state[compile_key.STATE_KEY] if keyed
        else {"VLLM_XLA_CACHE_PATH": "/data/cache/vllm/xla_cache", "VLLM_CONFIG_ROOT": "/home/u/.config/vllm"})


def test_a_vllm_without_the_factors_seam_compiles_and_says_so(monkeypatch, unwrapped, caplog):
    from foundry_core.engine import Mode

    _vllm_envs(monkeypatch, _envs("/data/cache/vllm/xla_cache", "/root/.config/vllm"))  # no compile_factors
    load = _runtime(monkeypatch, Mode.LOAD, types.SimpleNamespace(adapter=_recorded()))
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        load.carry_caches_in()
    assert "vLLM compiles the model instead of using the archive's" in caplog.text
    assert "VLLM_XLA_CACHE_PATH is /data/cache/vllm/xla_cache here" in caplog.text
    assert "start with VLLM_XLA_CACHE_PATH=/root/.cache/vllm/xla_cache to use it" in caplog.text
    assert "takes SAVE's" not in caplog.text
    assert load.adapter.state[compile_key.STATE_KEY]["VLLM_XLA_CACHE_PATH"] == "/data/cache/vllm/xla_cache"


def test_a_vllm_without_the_variables_records_and_changes_nothing():
    state: dict = {}
    compile_key.record(state, types.SimpleNamespace())
    assert state[compile_key.STATE_KEY] == {}
    assert compile_key.match(_recorded(), types.SimpleNamespace()) == {}
