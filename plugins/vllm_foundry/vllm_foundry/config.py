"""Reading vLLM's configuration without importing vLLM: the bottom of the plugin's modules.

vLLM's config objects differ between releases, so every module reads them through
:func:`config_value` (a missing step is the default, never an AttributeError) and compares
CUDA-graph modes by :func:`mode_name` (an enum member, its name or None). :data:`OFF_HINT` is the
setting that runs vLLM without Foundry, which every refusal of a configuration ends with.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OFF_HINT", "config_value", "mode_name"]

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
