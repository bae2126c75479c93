"""vllm-foundry's compile-cache key wrapper (compile_key.py) against the installed vLLM's own key
code, no GPU needed (marker ``engine``; skipped without vLLM).

Each case runs vLLM's ``aot_compile_hash_factors`` (the key of ``torch_aot_compile/<hash>``) and
computes the environment hash as ``VllmBackend.__call__`` does (``torch_compile_cache/<hash>``) in a fresh
Python: once as SAVE ran (its home and caches), once as a LOAD on a host whose home and cache
directories lie elsewhere, with and without the wrapper a LOAD installs. vLLM's config part of the
key is held equal, so only the environment's factors can differ."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]

PROBE = r"""
import json, sys
import vllm.envs as envs
from vllm.compilation import backends, caching
from vllm.config.utils import hash_factors  # as backends.py hashes them
from vllm_foundry import compile_key, patching

class Config:  # the model's part of the key: the same in every case
    def compute_hash(self):
        return "model"

recorded = json.loads(sys.argv[1])
differ = compile_key.match(recorded, envs) if recorded else {}
if differ:
    patching.install("compile.key_env_factors", compile_key.keyed_as_at_save(differ))
state = {}
compile_key.record(state, envs, differ)
print(json.dumps({"aot": [repr(f) for f in caching.aot_compile_hash_factors(Config())],
                  "dir": repr(hash_factors(backends.envs.compile_factors())), "state": state, "differ": differ}))
"""

VARIABLES = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH", "VLLM_CACHE_ROOT")


def _key(tmp_path, home: str, recorded: dict | None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(HOME=home, **extra)
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(recorded)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The key and record of a SAVE at its own home."""
    tmp = tmp_path_factory.mktemp("save")
    return {**_key(tmp, str(tmp / "save-home"), None), "home": str(tmp / "save-home")}


def _recorded(saved: dict) -> dict:
    from vllm_foundry import compile_key
    return saved["state"][compile_key.STATE_KEY]


def test_a_new_hosts_paths_change_vllms_key_and_the_wrapper_restores_saves(tmp_path, saved):
    state = _recorded(saved)
    assert set(state) == {"VLLM_XLA_CACHE_PATH", "VLLM_CONFIG_ROOT"} and "save-home" in state["VLLM_CONFIG_ROOT"]
    elsewhere = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    unwrapped = _key(tmp_path, str(tmp_path / "new-home"), {}, **elsewhere)
    assert unwrapped["aot"] != saved["aot"] and unwrapped["dir"] != saved["dir"]  # vLLM would compile

    load = _key(tmp_path, str(tmp_path / "new-home"), saved["state"], **elsewhere)
    assert set(load["differ"]) == {"VLLM_XLA_CACHE_PATH", "VLLM_CONFIG_ROOT"}
    assert load["aot"] == saved["aot"] and load["dir"] == saved["dir"]  # the archive's compiled model is found
    assert load["state"] == saved["state"]  # a LOAD that falls back to SAVE records the key it used


def test_the_same_paths_need_no_wrapper(tmp_path, saved):
    again = _key(tmp_path, saved["home"], saved["state"])
    assert again["differ"] == {} and again["aot"] == saved["aot"] and again["dir"] == saved["dir"]


def test_a_path_set_by_the_user_at_load_is_taken_as_at_save_too(tmp_path, saved):
    load = _key(tmp_path, str(tmp_path / "new-home"), saved["state"], VLLM_CONFIG_ROOT=str(tmp_path / "mine"))
    assert "VLLM_CONFIG_ROOT" in load["differ"] and load["aot"] == saved["aot"]
