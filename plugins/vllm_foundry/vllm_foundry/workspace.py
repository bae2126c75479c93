"""vLLM's shared workspace (``vllm/v1/worker/workspace.py``): one byte buffer per micro-batch slot
that the fused-MoE kernels (and some attention backends) carve their scratch tensors from. vLLM
grows it at its first use and keeps it; CUDA graphs captured later point into it.

Its first use is a forward that vLLM runs before capture (memory profiling, compile warmup). SAVE
runs those outside the region (paused) and LOAD skips them, so the captured graphs would point at
memory LOAD cannot reproduce: SAVE's pointer audit refuses such an archive (seen with a
mixture-of-experts model: ``fused_moe_kernel`` parameter outside the allocation region).

So at the start of the capture phase both sides allocate the workspace again, inside the region:
SAVE at the sizes its forwards grew it to, which go into the engine state, and LOAD at those
recorded sizes. The same requests at the same point of the allocation sequence get the same
addresses. A model that never used the workspace records no size and allocates nothing. The old
buffer is dropped; SAVE's came from the paused work's private pool, and goes back there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from vllm_foundry import patching, seams
from vllm_foundry.patching import SeamError

logger = logging.getLogger("foundry.vllm")

STATE_KEY = "workspace"

__all__ = ["STATE_KEY", "current_manager", "recorded_sizes", "rehome", "sizes", "torch_bytes"]


def current_manager() -> Any | None:
    """vLLM's workspace manager in this process, or None (not initialised, or a vLLM without one)."""
    try:
        initialised = patching.resolve(seams.seam("workspace.initialized"))[2]
        current = patching.resolve(seams.seam("workspace.current"))[2]
    except SeamError:
        return None
    return current() if initialised() else None


def _slots(manager: Any) -> list[Any]:
    slots = getattr(manager, "_current_workspaces", None)
    return slots if isinstance(slots, list) else []


def sizes(manager: Any) -> list[int]:
    """Bytes held by each of the manager's slots now (0 for a slot never used)."""
    return [0 if ws is None else int(ws.numel()) * int(ws.element_size()) for ws in _slots(manager)]


def recorded_sizes(state: Mapping[str, Any]) -> list[int]:
    """The per-slot sizes SAVE recorded in the engine state (none in an archive of a model that
    never used the workspace, or one written before the workspace was re-allocated)."""
    value = state.get(STATE_KEY) if isinstance(state, Mapping) else None
    if not isinstance(value, list) or not all(isinstance(n, int) and n >= 0 for n in value):
        return []
    return list(value)


def rehome(manager: Any, wanted: list[int], allocate: Callable[[int, Any], Any]) -> int:
    """Replaces each slot that ``wanted`` gives a size with ``allocate(size, device)``, slot by
    slot in order; returns the bytes allocated. A manager with fewer slots than ``wanted`` gets
    the ones it has (the archive's fingerprint already holds the settings that change the count)."""
    slots = _slots(manager)
    device = getattr(manager, "_device", None)
    total = 0
    for i, size in enumerate(wanted[:len(slots)]):
        if size <= 0:
            continue
        slots[i] = None  # let go of the old buffer before asking for the new one, as vLLM does
        slots[i] = allocate(size, device)
        total += size
    if total:
        logger.info("foundry: vLLM's workspace allocated in the region: %s bytes per slot", wanted[:len(slots)])
    return total


def torch_bytes(size: int, device: Any) -> Any:
    """A byte buffer of ``size`` on ``device``, as vLLM's manager allocates it."""
    import torch

    return torch.empty((size,), dtype=torch.uint8, device=device)
