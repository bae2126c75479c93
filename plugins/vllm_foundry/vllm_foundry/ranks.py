"""Rank identity and the decisions every rank must take alike.

**Global rank.** A worker's archive is ``<archive>/rank<global rank>``, the global rank counting
every rank of every data-parallel replica: ``replica * tensor x pipeline size + rank``, where
``rank`` is what vLLM hands the worker (its rank inside its own engine). vLLM 0.25 starts the
replicas in two ways (``EngineCoreProc.run_engine_core``, vllm/v1/engine/core.py):

- **MoE models**: one world across the replicas. ``data_parallel_size`` and
  ``data_parallel_rank`` keep their values, and ``init_distributed_environment`` offsets the
  worker's rank by ``data_parallel_rank * world_size``, as :func:`global_rank` does.
- **Dense models**: independent engines. vLLM sets ``data_parallel_size = 1`` and
  ``data_parallel_rank = 0`` in each replica's config and keeps the replica's index in
  ``data_parallel_index`` only; the replica count is known to process 0 alone, whose CLI seam
  exports it as ``FOUNDRY_VLLM_DP_SIZE`` (cli.py) for every process it starts.

So replica 1 of a TP-1, DP-2 start owns ``rank1`` either way, and the archive's topology counts
``tp x pp x replicas`` ranks (:func:`replicas`).

**Agreement.** A rank that captures runs collectives (profiling and warmup forwards, the capture
itself; with MoE data parallel, every forward first meets the other replicas on the DP group) that
a restoring peer never joins, and both then wait forever: so where one rank alone may find that it
cannot LOAD (its archive, its determinism boundary, its free memory, its NCCL launches), all ranks
of vLLM's world agree first, on the world group's CPU (gloo) communicator, and fall back together.
Dense replicas are separate worlds with no collective between them: each agrees alone.
"""

from __future__ import annotations

import os
from typing import Any

from foundry_core.engine import Mode
from foundry_core.engine.agreement import all_agree
from foundry_core.errors import InvalidArgumentError, StateError

from vllm_foundry import patching, seams
from vllm_foundry.config import OFF_HINT, config_value

MOE_DP_BACKENDS = ("allgather_reducescatter",)  # all-to-all through NCCL collectives, which LOAD re-makes
DP_SIZE_ENV = "FOUNDRY_VLLM_DP_SIZE"  # set by the CLI seam in process 0: the replicas of a `vllm serve`
DP_SIZE_LOCAL_ENV = "FOUNDRY_VLLM_DP_SIZE_LOCAL"  # ... of them on this node
DP_BACKEND_ENV = "FOUNDRY_VLLM_DP_BACKEND"  # ... and how vLLM starts them (mp, ray)


def _size(vllm_config: Any, name: str) -> int:
    return int(config_value(vllm_config, "parallel_config", name, default=1) or 1)


def _engine_ranks(vllm_config: Any) -> int:
    return _size(vllm_config, "tensor_parallel_size") * _size(vllm_config, "pipeline_parallel_size")


def world_size(vllm_config: Any) -> int:
    """Ranks in vLLM's torch.distributed world: tensor x pipeline x data parallel as the config
    says (MoE replicas share one world; a dense replica's config says data parallel size 1)."""
    return _engine_ranks(vllm_config) * _size(vllm_config, "data_parallel_size")


def _exported(environ: Any = None) -> tuple[int, int, str]:
    """(replicas, replicas on this node (0: not said), backend) as process 0's CLI seam exported them."""
    env = os.environ if environ is None else environ
    values = {}
    for name in (DP_SIZE_ENV, DP_SIZE_LOCAL_ENV):
        try:
            values[name] = int(env.get(name, "") or 0)
        except ValueError:
            raise InvalidArgumentError(f"{name}={env.get(name)!r} is not an integer; `vllm serve` sets it from "
                                       "--data-parallel-size, so unset it where it was set by hand") from None
    return max(values[DP_SIZE_ENV], 1), values[DP_SIZE_LOCAL_ENV], env.get(DP_BACKEND_ENV, "") or "mp"


def moe_replica_problems(vllm_config: Any) -> list[str]:
    """A mixture-of-experts model's replicas (vLLM keeps data_parallel_size > 1 in their engines,
    one world across them) exchange tokens inside the graphs: with the default all-to-all backend
    (``allgather_reducescatter``) through NCCL all-gathers and reduce-scatters (grouped broadcasts
    and reduces) on the expert-parallel group, collectives LOAD re-makes as for tensor parallel.
    The other backends (DeepEP, MoRI, NIXL, FlashInfer) use kernels and memory outside NCCL and
    are refused (docs/multi-gpu.md designs DeepEP's), as is elastic expert parallel."""
    if _size(vllm_config, "data_parallel_size") <= 1:
        return []
    problems = []
    backend = config_value(vllm_config, "parallel_config", "all2all_backend", default="allgather_reducescatter")
    if backend not in MOE_DP_BACKENDS:
        problems.append(f"all2all_backend={backend!r} exchanges tokens outside NCCL (its own kernels and memory); "
                        f"with data parallel only {', '.join(MOE_DP_BACKENDS)} is supported")
    if config_value(vllm_config, "parallel_config", "enable_elastic_ep", default=False):
        problems.append("elastic expert parallel (enable_elastic_ep) is not supported (it changes the groups while "
                        "serving)")
    return problems


def replica_problems(vllm_config: Any, environ: Any = None) -> list[str]:
    """The data-parallel settings this version refuses: those of :func:`moe_replica_problems`,
    replicas on several nodes (each node's archive would lack the others' ranks) and replicas
    started through Ray (their workers do not inherit the preload)."""
    count, local, backend = _exported(environ)
    problems = moe_replica_problems(vllm_config)
    dp = _size(vllm_config, "data_parallel_size")
    if count > 1 and 0 < local < count:
        problems.append(f"data parallel across nodes ({local} of {count} replicas on this node) is not supported "
                        "(one node)")
    if max(count, dp) > 1 and backend != "mp":
        problems.append(f"data parallel through {backend!r} is not supported (its workers do not start with the "
                        "preload; use data_parallel_backend='mp')")
    return problems


def replicas(vllm_config: Any, environ: Any = None) -> tuple[int, int]:
    """(this engine's replica index, the number of replicas) of the start; (0, 1) without data
    parallel. StateError when a dense replica's index is outside the exported count (the engine
    was not started through the plugin's CLI seam): two replicas would share one archive."""
    dp = _size(vllm_config, "data_parallel_size")
    if dp > 1:  # MoE: vLLM left the data-parallel settings as given
        return int(config_value(vllm_config, "parallel_config", "data_parallel_rank", default=0) or 0), dp
    count = _exported(environ)[0]
    index = int(config_value(vllm_config, "parallel_config", "data_parallel_index", default=0) or 0)
    if not 0 <= index < count:
        raise StateError(f"vllm-foundry: this engine is data-parallel replica {index}, but {DP_SIZE_ENV} says the "
                         f"start has {count} replica(s); start data parallel with `vllm serve --data-parallel-size N` "
                         f"(its CLI seam exports the count), or {OFF_HINT}")
    return index, count


def global_rank(vllm_config: Any, rank: int, environ: Any = None) -> int:
    """The global rank of the worker vLLM calls ``rank`` (its rank inside its engine): offset by
    the replica index, unless the ranks were launched from outside (``external_launcher``, where
    ``rank`` is already global)."""
    backend = config_value(vllm_config, "parallel_config", "distributed_executor_backend", default=None)
    if backend == "external_launcher":
        return rank
    return replicas(vllm_config, environ)[0] * _engine_ranks(vllm_config) + rank


def may_load(rt: Any) -> bool:
    """Whether some rank of this start may LOAD (mode load or auto, the same on every rank): then
    every rank answers every agreement, whatever its own mode, since one that fell back alone
    would run collectives its restoring peers never join."""
    return rt.session.requested in (Mode.LOAD, Mode.AUTO)


def all_ranks(rt: Any, ok: bool) -> bool:
    """True when ``ok`` holds on every rank of vLLM's world (``ok`` is this rank's answer). Each
    rank must call it at the same point, exactly once per decision; one GPU answers alone."""
    if world_size(rt.adapter.config) <= 1:
        return ok
    _, _, get_world_group = patching.resolve(seams.BY_NAME["parallel.world_group"])
    return all_agree(ok, get_world_group().cpu_group)
