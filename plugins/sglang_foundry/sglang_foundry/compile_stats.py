"""What torch.compile did in this scheduler (``--enable-torch-compile`` starts only), as one log line.

SGLang compiles its decode forward inside the capture loop, so the counters after that loop say
whether a start compiled anything: a LOAD runs the loop without forwards and should show none, a
warm SAVE should show cache hits, not misses. PyTorch keeps the counters in
``torch._dynamo.utils.counters`` (a dict of ``Counter`` per group); they are read, never imported
into a start that did not compile (an absent module means nothing was compiled).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("foundry.sglang")

# The groups that say how much was traced, compiled and found in the caches.
GROUPS = ("stats", "inductor", "aot_autograd")


def compile_counters(counters: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """``{"group.name": count}`` for the cache and graph counters of :data:`GROUPS` that are set."""
    found: dict[str, int] = {}
    for group in GROUPS:
        for name, count in sorted((counters.get(group) or {}).items()):
            if isinstance(count, int) and count and ("cache" in name or name in ("unique_graphs", "calls_captured")):
                found[f"{group}.{name}"] = count
    return found


def describe(found: Mapping[str, int]) -> str:
    """One line for the log: the counters, or that nothing was compiled."""
    if not found:
        return "nothing traced or compiled"
    return ", ".join(f"{name} {count}" for name, count in found.items())


def log_compile_stats(server_args: Any, what: str) -> None:
    """Logs the counters after ``what`` (e.g. "the capture phase") when the start compiles."""
    if not getattr(server_args, "enable_torch_compile", False):
        return
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None) or {}
    logger.info("foundry: torch.compile after %s: %s", what, describe(compile_counters(counters)))
