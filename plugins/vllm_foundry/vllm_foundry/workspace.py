"""vLLM's shared workspace (``vllm/v1/worker/workspace.py``): one byte buffer per micro-batch slot
that the fused-MoE kernels (and some attention backends) carve their scratch and outputs from.
vLLM grows it at its first use and keeps it; CUDA graphs captured later point into it.

Its first use is the memory profile's forward, which SAVE runs outside the region (paused) and
LOAD skips, so the captured graphs would point at memory LOAD cannot reproduce: SAVE's pointer
audit refuses such an archive (seen with a mixture-of-experts model: ``fused_moe_kernel``'s
output outside the allocation region).

So right after the memory profile (SAVE) and at the same point of LOAD (which skipped it), both
sides allocate the workspace again inside the region: SAVE at the sizes the profile grew it to,
which go into the engine state, and LOAD at those recorded sizes. Both come out of a pause that
emptied PyTorch's cache, so the same requests at the same point of the allocation sequence get
the same addresses; everything after (the attention backends' own reservations at KV-cache
setup, capture) then finds the same workspace on both sides. The profile runs the model's layers
at the largest batch vLLM schedules (V2: without attention), so the MoE layers do not grow it
again; attention code that takes workspace only inside a forward (decode context parallel) would
grow it in SAVE's paused compile warmup, outside the region, and SAVE then warns
(:func:`outside_region`) and its audit refuses the archive. A slot never used, or already in the
region, is left as it is (recorded as 0). The old buffer is let go after the new one exists;
on SAVE it lay in the profile's private pool, released when that pause ended, so its memory
goes back to the device at the next cache flush.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from foundry_core.engine import Mode

from vllm_foundry import patching, seams
from vllm_foundry.patching import SeamError

logger = logging.getLogger("foundry.vllm")

STATE_KEY = "workspace"

__all__ = ["STATE_KEY", "current_manager", "in_region", "outside_region", "place_in_region", "recorded_bytes",
           "recorded_sizes", "rehome", "sizes_to_place", "torch_bytes", "warn_if_grown_outside"]


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


def sizes_to_place(manager: Any, placed: Callable[[int], bool]) -> list[int]:
    """Bytes of each slot to allocate in the region: what it holds now, or 0 for a slot never used
    or whose buffer is already in the region (``placed(address)``)."""
    return [0 if ws is None or placed(int(ws.data_ptr())) else int(ws.numel()) * int(ws.element_size())
            for ws in _slots(manager)]


def recorded_sizes(state: Mapping[str, Any]) -> list[int]:
    """The per-slot sizes SAVE recorded in the engine state (none in an archive of a model that
    never used the workspace, or one written before the workspace was placed in the region)."""
    value = state.get(STATE_KEY) if isinstance(state, Mapping) else None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(n, int) and n >= 0 for n in value):
        logger.warning("foundry: the archive's engine state records vLLM's workspace as %r, not a list of byte counts; "
                       "LOAD allocates none (a SAVE writes it again)", value)
        return []
    return list(value)


def recorded_bytes(state: Mapping[str, Any]) -> int:
    """The device memory LOAD will allocate for the workspace (see :func:`recorded_sizes`)."""
    return sum(recorded_sizes(state))


def outside_region(manager: Any, placed: Callable[[int], bool]) -> list[int]:
    """The slots whose buffer is outside the region (grown after it was placed)."""
    return [i for i, size in enumerate(sizes_to_place(manager, placed)) if size]


def rehome(manager: Any, wanted: list[int], allocate: Callable[[int, Any], Any]) -> int:
    """Gives each slot that ``wanted`` sizes a new ``allocate(size, device)`` buffer, in slot
    order, and lets go of its old one after; returns the bytes allocated. Sizes beyond the
    manager's slots are ignored (more slots only with dual-batch overlap, which vllm-foundry
    refuses)."""
    slots = _slots(manager)
    device = getattr(manager, "_device", None)
    total = 0
    for i, size in enumerate(wanted[:len(slots)]):
        if size > 0:
            slots[i] = allocate(size, device)  # the old buffer goes only once the new one exists
            total += size
    if total:
        logger.info("foundry: vLLM's workspace allocated in the region: %s bytes per slot", wanted[:len(slots)])
    return total


def torch_bytes(size: int, device: Any) -> Any:
    """A byte buffer of ``size`` on ``device``, as vLLM's manager allocates it."""
    import torch

    return torch.empty((size,), dtype=torch.uint8, device=device)


def in_region(address: int) -> bool:
    """Whether ``address`` lies in this process's allocation region (False without one)."""
    from foundry_core.errors import FoundryError
    from foundry_core.region import region_info

    try:
        info = region_info()
    except FoundryError:
        return False
    return info.base <= address < info.base + info.size


def place_in_region(rt: Any) -> None:
    """SAVE, after the memory profile: the workspace's used slots again in the region, their sizes
    into the engine state. LOAD, where it skipped the profile: the recorded sizes. Both record
    what they allocated, for a LOAD that falls back later and saves again. Nothing otherwise."""
    manager = current_manager()
    if manager is None or rt.mode not in (Mode.SAVE, Mode.LOAD) or not rt.region_open:
        return
    if rt.mode is Mode.SAVE:
        wanted = sizes_to_place(manager, in_region)
    else:
        wanted = recorded_sizes(rt.recorded_adapter_state())
    rt.adapter.state[STATE_KEY] = wanted
    rehome(manager, wanted, torch_bytes)


def warn_if_grown_outside(rt: Any) -> None:
    """SAVE, before capture: a workspace slot that grew again after it was placed (outside the
    region) makes every graph using it unsaveable; say so by name before the audit does."""
    manager = current_manager()
    if manager is None or rt.mode is not Mode.SAVE or not rt.region_open:
        return
    slots = outside_region(manager, in_region)
    if slots:
        logger.warning("foundry: vLLM's shared workspace grew after the memory profile, outside the region (slots "
                       "%s); graphs that use it cannot be saved, so SAVE will refuse the archive and this start goes "
                       "on without one. A forward between the profile and capture (compile warmup) needed more than "
                       "the profile did: this configuration cannot be saved yet", slots)
