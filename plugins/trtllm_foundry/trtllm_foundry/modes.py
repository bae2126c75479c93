"""Which TensorRT-LLM configurations trtllm-foundry supports, and the refusal for the others.

Supported in this version: the PyTorch backend on one GPU (tensor, pipeline, context and expert
parallel size 1, no attention data parallelism), its decode CUDA graphs (``cuda_graph_config``, on
by default), no torch.compile, no speculative decoding, no LoRA, no sleep mode, no KV connector or
cache transceiver, no sparse attention, MPI orchestration (or ``TLLM_WORKER_USE_SINGLE_PROCESS=1``).

Why each refusal (TensorRT-LLM 1.2 source, see docs/engine-trtllm.md):

- torch.compile (``torch_compile_config``): Inductor compiles in warmups LOAD skips, and its
  piecewise graphs are captured through another path the plugin does not save;
- tensor / pipeline parallel: the decode graphs then hold all-reduces (NCCL, MNNVL, or the custom
  kernels whose peer pointers come from ``cudaIpcOpenMemHandle`` at every start) that v1 does not
  restore; context parallel skips the warmups altogether; expert parallel adds MoE all-to-all
  (NCCL / MNNVL / DeepEP) buffers; attention DP needs several ranks;
- ``allreduce_strategy`` NCCL_SYMMETRIC, UB or MNNVL: communicator memory (user buffers, NVLink
  fabric handles) the deterministic region cannot back;
- Ray (``orchestrator_type='ray'``) or ``TLLM_DISABLE_MPI=1``: the workers are started by Ray, whose
  environment cannot carry the preload in time;
- speculative decoding, LoRA, sparse attention with short/long graphs: other graph variants and a
  second model engine;
- ``enable_sleep``: TensorRT-LLM's virtual-memory allocator maps weights and KV outside the region;
- KV connector, cache transceiver (disaggregated serving): transfer engines that register device
  memory at run time;
- ``cuda_graph_config=None``: no decode graphs, nothing to save or restore;
- a backend other than ``pytorch`` (TensorRT engines, AutoDeploy).

Policy: **refuse**. When Foundry is active and the configuration is not supported, the start fails
before the first device allocation (in the ``LLM`` process before the workers start, and again in
each worker before the model engine is built), naming every unsupported setting and the way out.
An archive that cannot be used (missing, stale, corrupt) is different: it falls back to a normal
start (foundry_core.engine.session's fallback policy).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from foundry_core.errors import UnsupportedError

__all__ = ["OFF_HINT", "UnsupportedConfigError", "setting", "name_of", "unsupported_settings", "format_refusal",
           "check_supported", "refuse"]

OFF_HINT = "start TensorRT-LLM with FOUNDRY_MODE=off (or --foundry-mode off) to run it without Foundry"
REFUSED_ALLREDUCE = ("NCCL_SYMMETRIC", "UB", "MNNVL")
_TRUE = ("1", "true", "yes", "on")

# (llm_args field, what to say) for settings that must be None / unset.
_MUST_BE_NONE = (
    ("torch_compile_config", "torch.compile (torch_compile_config) compiles and captures piecewise graphs in "
                             "warmups a LOAD start skips"),
    ("speculative_config", "speculative decoding (speculative_config) captures draft-length variants and a draft "
                           "model engine"),
    ("lora_config", "LoRA (lora_config) changes the captured graphs per adapter"),
    ("kv_connector_config", "a KV connector (kv_connector_config) registers KV memory with a transfer engine"),
    ("cache_transceiver_config", "disaggregated serving (cache_transceiver_config) registers KV memory with a "
                                 "transceiver"),
    ("sparse_attention_config", "sparse attention (sparse_attention_config) captures short- and long-sequence "
                                "graph variants"),
)
# (llm_args field, what to say) for boolean settings that must be off.
_MUST_BE_OFF = (
    ("enable_attention_dp", "attention data parallelism (enable_attention_dp) needs several ranks"),
    ("enable_sleep", "sleep mode (enable_sleep) maps weights and KV through TensorRT-LLM's virtual memory "
                     "allocator, outside the deterministic region"),
    ("mm_encoder_only", "a multimodal encoder-only start captures no decode graphs"),
)
_PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size")


class UnsupportedConfigError(UnsupportedError):
    """TensorRT-LLM runs with a setting trtllm-foundry does not support (the message names it)."""


def setting(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name``, or ``default`` when it is missing or None (the arguments differ between releases)."""
    value = getattr(obj, name, None)
    return default if value is None else value


def name_of(value: Any) -> str:
    """An enum member's name, or the value's ``str`` (TensorRT-LLM mixes enums and strings)."""
    return str(getattr(value, "name", value))


def _parallel_problems(llm_args: Any) -> list[str]:
    problems = []
    for name in _PARALLEL:
        value = setting(llm_args, name, 1)
        if value != 1:
            problems.append(f"{name}={value} is not supported (one GPU in this version: the all-reduces inside "
                            "the graphs, NCCL, MNNVL or the custom kernels' IPC peer pointers, are not restored)")
    ep = setting(llm_args, "moe_expert_parallel_size", 1)
    if ep not in (1, -1):
        problems.append(f"moe_expert_parallel_size={ep} is not supported (expert-parallel all-to-all buffers)")
    cp_config = setting(llm_args, "cp_config", {})
    if isinstance(cp_config, Mapping) and cp_config.get("cp_type") is not None:
        problems.append(f"context parallelism (cp_config cp_type={name_of(cp_config['cp_type'])}) is not supported: "
                        "TensorRT-LLM skips the warmups and captures no graphs")
    return problems


def _engine_problems(llm_args: Any) -> list[str]:
    problems = []
    backend = setting(llm_args, "backend", "pytorch")
    if name_of(backend) != "pytorch":
        problems.append(f"backend={name_of(backend)!r} is not supported (the PyTorch backend only)")
    if getattr(llm_args, "cuda_graph_config", "unset") is None:
        problems.append("CUDA graphs are off (cuda_graph_config=None), so there is nothing to save or restore")
    strategy = name_of(setting(llm_args, "allreduce_strategy", "AUTO"))
    if strategy in REFUSED_ALLREDUCE:
        problems.append(f"allreduce_strategy={strategy} allocates communicator memory the deterministic region "
                        "cannot back")
    orchestrator = setting(llm_args, "orchestrator_type")
    if orchestrator is not None and name_of(orchestrator) == "ray":
        problems.append("Ray orchestration (orchestrator_type='ray') is not supported: Ray starts the workers "
                        "without the preload")
    for name, why in _MUST_BE_NONE:
        if setting(llm_args, name) is not None:
            problems.append(f"{why}; it is not supported")
    for name, why in _MUST_BE_OFF:
        if setting(llm_args, name, False) is True:
            problems.append(f"{why}; it is not supported")
    return problems


def unsupported_settings(llm_args: Any, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every setting of ``llm_args`` (TorchLlmArgs, read with getattr) and of the environment this
    version cannot handle, one message each; empty when everything is supported."""
    env = os.environ if environ is None else environ
    problems = _engine_problems(llm_args) + _parallel_problems(llm_args)
    if env.get("TLLM_DISABLE_MPI", "").strip().lower() in _TRUE:
        problems.append("TLLM_DISABLE_MPI=1 (workers through torch.distributed or Ray) is not supported; unset it")
    return problems


def format_refusal(problems: list[str]) -> str:
    return "trtllm-foundry cannot run this TensorRT-LLM configuration: " + "; ".join(problems) + f". Or {OFF_HINT}."


def check_supported(llm_args: Any, environ: Mapping[str, str] | None = None) -> None:
    """Raises UnsupportedConfigError listing every unsupported setting; returns when all are fine."""
    problems = unsupported_settings(llm_args, environ)
    if problems:
        raise UnsupportedConfigError(format_refusal(problems))


def refuse(problem: str) -> UnsupportedConfigError:
    """The error for one unsupported setting found at a seam (raise it)."""
    return UnsupportedConfigError(format_refusal([problem]))
