"""Decisions every tensor-parallel rank must take alike.

A rank that captures runs collectives (profiling and warmup forwards, the capture itself) that a
restoring peer never joins, and both then wait forever: so where one rank alone may find that it
cannot LOAD (free memory, its archive, its NCCL launches), the ranks agree first, on the
tensor-parallel group's CPU (gloo) communicator, and fall back together.
"""

from __future__ import annotations

from typing import Any

from vllm_foundry import modes, patching, seams


def all_ranks(rt: Any, ok: bool) -> bool:
    """True when ``ok`` holds on every tensor-parallel rank (``ok`` is this rank's answer). Each
    rank must call it at the same point, exactly once per decision; one GPU answers alone."""
    if int(modes.config_value(rt.adapter.config, "parallel_config", "tensor_parallel_size", default=1) or 1) <= 1:
        return ok
    import torch
    import torch.distributed as dist

    _, _, get_tp_group = patching.resolve(seams.BY_NAME["parallel.tp_group"])
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=get_tp_group().cpu_group)
    return bool(flag.item())
