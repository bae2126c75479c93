"""One decision every rank of an engine takes alike: a rank that captures while a peer restores
runs collectives the peer never joins, and both wait forever, so the ranks agree before either
commits (the plugins' ``ranks.py`` say where)."""

from __future__ import annotations

from typing import Any

__all__ = ["all_agree"]


def all_agree(ok: bool, cpu_group: Any) -> bool:
    """True when ``ok`` holds on every rank of ``cpu_group`` (the engine's gloo group): one flag,
    reduced by its minimum. Every rank must call it at the same point, once per decision."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=cpu_group)
    return bool(flag.item())
