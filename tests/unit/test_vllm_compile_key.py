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


def test_load_at_another_cache_directory_takes_saves_xla_path(caplog):
    environ: dict[str, str] = {"XDG_CACHE_HOME": "/data/cache"}
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        changed = compile_key.match(_recorded(), _envs("/data/cache/vllm/xla_cache", "/root/.config/vllm"), environ)
    assert changed == {"VLLM_XLA_CACHE_PATH": "/root/.cache/vllm/xla_cache"}
    assert environ["VLLM_XLA_CACHE_PATH"] == "/root/.cache/vllm/xla_cache"
    assert "as at SAVE (/data/cache/vllm/xla_cache here)" in caplog.text


def test_a_value_the_user_set_is_kept():
    environ = {"VLLM_XLA_CACHE_PATH": "/mine"}
    assert compile_key.match(_recorded(), _envs("/mine", "/root/.config/vllm"), environ) == {}
    assert environ == {"VLLM_XLA_CACHE_PATH": "/mine"}


def test_the_same_paths_change_nothing(caplog):
    environ: dict[str, str] = {}
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        assert compile_key.match(_recorded(), SAVED, environ) == {}
    assert environ == {} and caplog.text == ""


def test_another_config_root_is_named_not_changed(caplog):
    environ: dict[str, str] = {}
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        compile_key.match(_recorded(), _envs("/root/.cache/vllm/xla_cache", "/home/u/.config/vllm"), environ)
    assert "VLLM_CONFIG_ROOT" not in environ
    assert "VLLM_CONFIG_ROOT is /home/u/.config/vllm here and was /root/.config/vllm at SAVE" in caplog.text
    assert "set VLLM_CONFIG_ROOT=/root/.config/vllm to use it" in caplog.text


def test_an_archive_without_the_record_changes_nothing():
    environ: dict[str, str] = {}
    assert compile_key.match({"kv_cache_bytes": 1}, _envs("/x", "/y"), environ) == {}
    assert environ == {}


def test_a_vllm_that_leaves_the_paths_out_of_its_key_changes_nothing(caplog):
    envs = _envs("/data/cache/vllm/xla_cache", "/home/u/.config/vllm")
    envs.compile_factors = lambda: {"VLLM_USE_AOT_COMPILE": "1"}  # vLLM 0.34 ignores both paths
    environ: dict[str, str] = {}
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        assert compile_key.match(_recorded(), envs, environ) == {}
    assert environ == {} and caplog.text == ""


def test_a_vllm_that_hashes_them_is_matched():
    envs = _envs("/data/cache/vllm/xla_cache", "/root/.config/vllm")
    envs.compile_factors = lambda: {"VLLM_XLA_CACHE_PATH": "/data/cache/vllm/xla_cache", "VLLM_CONFIG_ROOT": "x"}
    environ: dict[str, str] = {}
    assert compile_key.match(_recorded(), envs, environ) == {"VLLM_XLA_CACHE_PATH": "/root/.cache/vllm/xla_cache"}


# ---- the worker runtime: recorded at SAVE, matched at LOAD, before vLLM computes its key ------------------


class _Session:
    def __init__(self, mode, state=None):
        self.mode = self.requested = mode
        self.state = state

    def recorded_state(self):
        return self.state


def _runtime(monkeypatch, mode, state=None, carried=("torch_aot_compile/h/rank_0_0/model",)):
    """vllm-foundry's WorkerRuntime over a session in ``mode``; its core carrying replaced by an
    archive whose vLLM compile-cache tree holds ``carried``."""
    from foundry_core.engine import worker
    from vllm_foundry import compile_cache, runtime

    def carry_in(rt):
        rt.carried_in = types.SimpleNamespace(paths=lambda cache: list(carried) if cache == compile_cache.CACHE else [])

    monkeypatch.setattr(worker.WorkerRuntime, "carry_caches_in", carry_in)
    return runtime.WorkerRuntime(_Session(mode, state), types.SimpleNamespace(state={}))


def _vllm_envs(monkeypatch, envs):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(envs=envs, __path__=[]))
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)


@pytest.mark.parametrize("carried, pinned", [(("torch_aot_compile/h/rank_0_0/model",), True), ((), False)])
def test_a_save_then_a_load_at_another_cache_directory(monkeypatch, carried, pinned):
    from foundry_core.engine import Mode

    monkeypatch.delenv("VLLM_XLA_CACHE_PATH", raising=False)
    _vllm_envs(monkeypatch, SAVED)
    save = _runtime(monkeypatch, Mode.SAVE)
    save.carry_caches_in()
    assert save.adapter.state[compile_key.STATE_KEY]["VLLM_XLA_CACHE_PATH"] == "/root/.cache/vllm/xla_cache"

    _vllm_envs(monkeypatch, _envs("/data/cache/vllm/xla_cache", "/root/.config/vllm"))
    load = _runtime(monkeypatch, Mode.LOAD, types.SimpleNamespace(adapter=save.adapter.state), carried)
    load.carry_caches_in()
    # Only where the archive carries vLLM's compiled model: else the host's own cache keeps its key.
    assert (os.environ.get("VLLM_XLA_CACHE_PATH") == "/root/.cache/vllm/xla_cache") is pinned
    assert compile_key.STATE_KEY in load.adapter.state  # what a LOAD that falls back to SAVE records


def test_a_vllm_without_the_variables_records_and_changes_nothing():
    state: dict = {}
    compile_key.record(state, types.SimpleNamespace())
    assert state[compile_key.STATE_KEY] == {}
    environ: dict[str, str] = {}
    assert compile_key.match(_recorded(), types.SimpleNamespace(), environ) == {} and environ == {}


def test_a_value_the_user_set_that_differs_is_named(caplog):
    environ = {"VLLM_XLA_CACHE_PATH": "/mine"}
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        compile_key.match(_recorded(), _envs("/mine", "/root/.config/vllm"), environ)
    assert environ == {"VLLM_XLA_CACHE_PATH": "/mine"}
    assert "VLLM_XLA_CACHE_PATH is /mine here and was /root/.cache/vllm/xla_cache at SAVE" in caplog.text
