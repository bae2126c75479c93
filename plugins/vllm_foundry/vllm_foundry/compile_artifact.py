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
cache key, so the first Foundry start compiles once more, as for any such setting. Not with the
experimental piecewise path (``FOUNDRY_VLLM_PIECEWISE=1``), which has not run with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import metadata

MEGA_AOT_ENV = "VLLM_USE_MEGA_AOT_ARTIFACT"
_MIN_TORCH = (2, 10)


def installed_torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def whole_artifact_wanted(env: Mapping[str, str], torch_version: str | None, pieces: bool = False) -> bool:
    """Whether Foundry should set ``VLLM_USE_MEGA_AOT_ARTIFACT=1`` in ``env`` (see the module);
    ``pieces``: the piecewise path is on."""
    if MEGA_AOT_ENV in env or pieces:
        return False  # the user's choice, either way; pieces have not run with it
    if env.get("VLLM_USE_STANDALONE_COMPILE", "1").strip() != "1":
        return False  # vLLM refuses the whole artifact without standalone compile
    if env.get("VLLM_DISABLE_COMPILE_CACHE", "0").strip() not in ("", "0"):
        return False  # nothing is loaded from a cache
    if env.get("VLLM_USE_AOT_COMPILE", "").strip() == "0":
        return False
    release = _release(torch_version) if torch_version else None
    return release is not None and release >= _MIN_TORCH
