"""vLLM's compiled model loaded whole at LOAD (``VLLM_USE_MEGA_AOT_ARTIFACT=1``).

A LOAD start skips vLLM's memory profiling, so the compiled model is first called by vLLM's JIT
warmup, which loads it from vLLM's compile cache. With torch 2.11 vLLM 0.25 by default splits the
loaded graph again and loads every piece: 8-9 s with Qwen3-8B shapes on an H200, the whole of
LOAD's distance to an ``enforce_eager`` start. vLLM's whole-model artifact loads the same
compiled model in 0.4-0.5 s there (bench/results/vllm-0.25.0-h200.md), with identical outputs;
vLLM turns it on by default from torch 2.12. In Foundry mode the plugin turns it on where vLLM
supports it (torch 2.10 or newer, vLLM's AOT compile and its compile cache on, standalone compile
on, which vLLM requires with it) and the user has not set the variable: set
``VLLM_USE_MEGA_AOT_ARTIFACT=0`` to keep vLLM's default. The variable is part of vLLM's compile
cache key, so the first Foundry start compiles once more, as for any such setting. Restored
pieces work with it: a piece's name is its index among the compiled pieces, which vLLM's artifact
path takes from the split module's children in order (``StandaloneCompiledArtifacts.submodule_names``)
and its compile from the split's graph ids, the same order for vLLM's split; and a piece is only
installed where its tensor arguments sit at SAVE's addresses (each piece reads other buffers), so a
renumbering would run pieces eagerly, never swap them (piecewise.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

from packaging.version import InvalidVersion, Version

MEGA_AOT_ENV = "VLLM_USE_MEGA_AOT_ARTIFACT"
_MIN_TORCH = Version("2.10.0")  # vLLM's own test (compiler_interface.py, envs.use_aot_compile)


def installed_torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def _torch_new_enough(torch_version: str | None) -> bool:
    """vLLM's ``is_torch_equal_or_newer("2.10.0")``: a pre-release such as 2.10.0a0 is older."""
    try:
        return torch_version is not None and Version(torch_version) >= _MIN_TORCH
    except InvalidVersion:
        return False


def whole_artifact_wanted(env: Mapping[str, str], torch_version: str | None) -> bool:
    """Whether Foundry should set ``VLLM_USE_MEGA_AOT_ARTIFACT=1`` in ``env`` (see the module).
    Reads vLLM's variables as vLLM 0.25's ``envs`` does."""
    if MEGA_AOT_ENV in env:
        return False  # the user's choice, either way
    if not _torch_new_enough(torch_version):
        return False  # no whole artifact in vLLM's standalone compile before torch 2.10
    if env.get("VLLM_USE_STANDALONE_COMPILE", "1") != "1":
        return False  # vLLM refuses the whole artifact without standalone compile
    try:
        cache_off = bool(int(env.get("VLLM_DISABLE_COMPILE_CACHE", "0")))
    except ValueError:
        return False  # vLLM itself would fail on it: leave vLLM to say so
    # vLLM's AOT compile: on when the variable is "1", by default "1" unless the cache is off.
    return not cache_off and env.get("VLLM_USE_AOT_COMPILE", "1") == "1"
