"""Reading vLLM's configuration without importing vLLM: the bottom of the plugin's modules.

vLLM's config objects differ between releases, so every module reads them through
:func:`config_value` (a missing step is the default, never an AttributeError) and compares
CUDA-graph modes by :func:`mode_name` (an enum member, its name or None). :data:`OFF_HINT` is the
setting that runs vLLM without Foundry, which every refusal of a configuration ends with.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["OFF_HINT", "config_value", "mode_name", "uses_v2_runner"]

V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"  # removed in vLLM 0.34.0

OFF_HINT = "start vLLM with --foundry-mode off (or FOUNDRY_MODE=off) to run it without Foundry"


def config_value(obj: Any, *path: str, default: Any = None) -> Any:
    """``obj.a.b.c`` for path ("a", "b", "c"), or ``default`` where any step is missing or None
    (vLLM's config objects differ between releases)."""
    for name in path:
        if obj is None:
            return default
        obj = getattr(obj, name, None)
    return default if obj is None else obj


def mode_name(mode: Any) -> str:
    """The name of a CUDAGraphMode (an enum member, its name, or None)."""
    if mode is None:
        return "NONE"
    name = getattr(mode, "name", None)
    if isinstance(name, str):
        return name
    text = str(mode)
    return text.rsplit(".", 1)[-1].upper()


def uses_v2_runner(vllm_config: Any, worker: Any = None) -> bool:
    """Whether vLLM runs its V2 GPU model runner. Releases up to 0.33 name their choice
    (``Worker.use_v2_model_runner``, ``VllmConfig.use_v2_model_runner``); 0.34.0 removed the V1
    runner and the attribute with it, so where the attribute is absent and the V1 runner's module
    is gone, V2 is the only runner."""
    for obj in (worker, vllm_config):
        value = getattr(obj, "use_v2_model_runner", None) if obj is not None else None
        if value is not None:
            return bool(value)
    try:
        return importlib.util.find_spec(V1_RUNNER_MODULE) is None
    except (ImportError, ValueError, AttributeError):  # no vLLM here (or a stand-in without packages)
        return False
