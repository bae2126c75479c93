"""Installing a patch module's wrappers: all of them, or those of one TensorRT-LLM module (the one
the import hook just executed)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from foundry_core.engine.patching import SeamError

from trtllm_foundry import patching, seams

logger = logging.getLogger("foundry.tensorrt_llm")

Wrappers = Mapping[str, Callable[[Callable[..., Any]], Callable[..., Any]]]

__all__ = ["install_wrappers"]


def install_wrappers(wrappers: Wrappers, module: str | None = None) -> list[str]:
    """Wraps every seam of ``wrappers`` (only those in ``module`` when given); returns the names it
    wrapped. A required seam that is missing raises SeamError; an optional one logs a warning."""
    done = []
    for name, make in wrappers.items():
        s = seams.seam(name)
        if module is not None and s.module != module:
            continue
        try:
            if patching.install(name, make):
                done.append(name)
        except SeamError as exc:
            if s.required:
                raise
            logger.warning("foundry: %s; the plugin goes on without it", exc)
    return done
