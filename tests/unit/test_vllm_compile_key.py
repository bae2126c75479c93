"""vllm-foundry's compile_key.py: the host paths in vLLM's compile-cache key recorded at SAVE and
matched at LOAD, so that a LOAD at other cache or home directories finds the archive's compiled model."""

from __future__ import annotations

import logging
import types

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
