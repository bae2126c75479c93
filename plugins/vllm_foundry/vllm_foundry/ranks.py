"""Rank identity and the decisions every rank must take alike.

**Global rank.** A worker's archive is ``<archive>/rank<global rank>``. vLLM hands the worker its
rank inside one engine (tensor x pipeline parallel); with data parallel, each engine is one
replica and vLLM offsets that rank by ``data_parallel_rank * world_size`` when it joins the
world (``init_distributed_environment``). :func:`global_rank` makes the same offset, so replica 1
of a TP-1, DP-2 start owns ``rank1``.

**Agreement.** A rank that captures runs collectives (profiling and warmup forwards, the capture
itself; with data parallel, every forward first meets the other replicas on the DP group) that a
restoring peer never joins, and both then wait forever: so where one rank alone may find that it
cannot LOAD (free memory, its archive, its NCCL launches), all ranks of the world agree first, on
the world group's CPU (gloo) communicator, and fall back together.
"""

from __future__ import annotations

from typing import Any

from vllm_foundry import modes, patching, seams


def _size(vllm_config: Any, name: str) -> int:
    return int(modes.config_value(vllm_config, "parallel_config", name, default=1) or 1)


def world_size(vllm_config: Any) -> int:
    """Ranks across every replica: tensor x pipeline x data parallel."""
    return (_size(vllm_config, "tensor_parallel_size") * _size(vllm_config, "pipeline_parallel_size")
            * _size(vllm_config, "data_parallel_size"))


def global_rank(vllm_config: Any, rank: int) -> int:
    """The world rank of the worker vLLM calls ``rank`` (its rank inside its engine), as vLLM's
    ``init_distributed_environment`` computes it: offset by the data-parallel rank unless the
    ranks were launched from outside (``external_launcher``, where ``rank`` is already global)."""
    dp = _size(vllm_config, "data_parallel_size")
    backend = modes.config_value(vllm_config, "parallel_config", "distributed_executor_backend", default=None)
    if dp <= 1 or backend == "external_launcher":
        return rank
    dp_rank = int(modes.config_value(vllm_config, "parallel_config", "data_parallel_rank", default=0) or 0)
    return dp_rank * _size(vllm_config, "tensor_parallel_size") * _size(vllm_config, "pipeline_parallel_size") + rank


def all_ranks(rt: Any, ok: bool) -> bool:
    """True when ``ok`` holds on every rank of the world (``ok`` is this rank's answer). Each rank
    must call it at the same point, exactly once per decision; one GPU answers alone."""
    if world_size(rt.adapter.config) <= 1:
        return ok
    import torch
    import torch.distributed as dist

    _, _, get_world_group = patching.resolve(seams.BY_NAME["parallel.world_group"])
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=get_world_group().cpu_group)
    return bool(flag.item())
