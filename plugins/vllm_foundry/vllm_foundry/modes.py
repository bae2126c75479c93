"""Which vLLM configurations vllm-foundry supports, and the refusal for the others.

Supported in this version: the V2 model runner (vLLM's default since 0.25 for most models),
``cudagraph_mode`` ``FULL_AND_PIECEWISE`` (vLLM's default: full graphs of uniform decode batches,
piecewise graphs of the others; piecewise.py) without Inductor graph partition or breakable CUDA
graphs, and ``FULL_DECODE_ONLY`` (decode graphs only, the mode without torch.compile); one GPU,
tensor parallel, expert parallel over the tensor-parallel group, data parallel of dense models
(pipeline parallel size 1), no speculative decoding, no LoRA, no sleep mode, no dual-batch
overlap, no CPU weight offload. ``FOUNDRY_VLLM_PIECEWISE=0`` refuses
``FULL_AND_PIECEWISE``. ``PIECEWISE`` alone is refused: vLLM then captures no decode graph and
makes none of the decode output buffers the archive's graphs are restored around.

Policy: **refuse**. When Foundry is active (an archive is given and the mode is not ``off``) and
the configuration is not supported, the worker raises UnsupportedConfigError before its first
device allocation, naming every unsupported setting, the supported value and the way out
(``--foundry-mode off`` starts vLLM without Foundry). Falling back silently would make every later
start pay the full capture while the user believes the archive is used; an archive that cannot be
used (missing, stale, corrupt) still falls back to a normal start, as the fallback policy says.
"""

from __future__ import annotations

from typing import Any

from foundry_core.engine.options import env_flag, instantiate_mode as _instantiate_mode
from foundry_core.errors import UnsupportedError

from vllm_foundry import piecewise, ranks
from vllm_foundry.config import OFF_HINT, config_value, mode_name, uses_v2_runner  # re-exported: the patches read them here

SUPPORTED_CUDAGRAPH_MODES = ("FULL_DECODE_ONLY",)  # and the piecewise ones below, unless turned off
CUDAGRAPH_MODE_FLAG = "-cc.cudagraph_mode=FULL_DECODE_ONLY"
# Without torch.compile (-cc.mode=none) vLLM turns its default FULL_AND_PIECEWISE into NONE.
NONE_HINT = "vLLM captures no graphs in this mode: without torch.compile (-cc.mode=none) pass " + CUDAGRAPH_MODE_FLAG


INSTANTIATE_ENV = "FOUNDRY_VLLM_INSTANTIATE"          # eager (default) | parallel | lazy | background
INSTANTIATE_THREADS_ENV = "FOUNDRY_VLLM_INSTANTIATE_THREADS"  # default 4


def instantiate_mode() -> tuple[str, int]:
    """How LOAD instantiates the restored graphs (FOUNDRY_VLLM_INSTANTIATE, ..._THREADS);
    InvalidArgumentError naming the variable for a wrong value."""
    return _instantiate_mode(INSTANTIATE_ENV, INSTANTIATE_THREADS_ENV)


class UnsupportedConfigError(UnsupportedError):
    """vLLM runs with a setting vllm-foundry does not support (the message names it)."""


PIECEWISE_CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE",)


def supported_cudagraph_modes() -> tuple[str, ...]:
    return (PIECEWISE_CUDAGRAPH_MODES if piecewise.enabled() else ()) + SUPPORTED_CUDAGRAPH_MODES


def cudagraph_mode_problem(mode: Any) -> str | None:
    """Why ``mode`` is not supported (naming it and the supported ones), or None."""
    name = mode_name(mode)
    supported = supported_cudagraph_modes()
    if name in supported:
        return None
    way_out = f"pass {CUDAGRAPH_MODE_FLAG}" + (" or leave vLLM's default" if piecewise.enabled() else "")
    if name in PIECEWISE_CUDAGRAPH_MODES:
        why = f"piecewise graphs are off: {piecewise.disabled_reason()}; {way_out}"
    elif name == "NONE":
        why = NONE_HINT
    elif name == "PIECEWISE":
        why = f"pieces without decode graphs are not saved; {way_out}"
    else:
        why = way_out
    return f"cudagraph_mode={name} is not supported ({why}; supported: {', '.join(supported)})"


def piecewise_problems(vllm_config: Any, environ: Any = None) -> list[str]:
    """What the piecewise path cannot restore: pieces made by Inductor's graph partition or by
    vLLM's breakable CUDA graphs (other wrapper classes). Pieces with tensor parallel, their
    all-reduces inside them, restore as the FULL graphs do (the same NCCL handling)."""
    problems = []
    if config_value(vllm_config, "compilation_config", "use_inductor_graph_partition", default=False):
        problems.append("use_inductor_graph_partition=True is not supported with piecewise graphs")
    if env_flag("VLLM_USE_BREAKABLE_CUDAGRAPH", default=False, environ=environ):
        problems.append("VLLM_USE_BREAKABLE_CUDAGRAPH=1 is not supported with piecewise graphs")
    return problems


def unsupported_settings(vllm_config: Any, use_v2_model_runner: bool | None = None) -> list[str]:
    """Every setting of ``vllm_config`` this version cannot handle, as one message each."""
    problems = []
    if use_v2_model_runner is None:
        use_v2_model_runner = uses_v2_runner(vllm_config)
    if config_value(vllm_config, "model_config", "enforce_eager", default=False):
        problems.append("enforce_eager=True captures no CUDA graphs, so there is nothing to save or restore "
                        "(drop --enforce-eager)")
    else:
        mode = config_value(vllm_config, "compilation_config", "cudagraph_mode")
        problem = cudagraph_mode_problem(mode)
        if problem:
            problems.append(problem)
        elif mode_name(mode) in PIECEWISE_CUDAGRAPH_MODES:
            problems += piecewise_problems(vllm_config)
    if not use_v2_model_runner:
        problems.append("the V1 model runner is not supported (vLLM chose V1 because of VLLM_USE_V2_MODEL_RUNNER=0 "
                        "or a feature V2 lacks; see vLLM's 'using the V1 model runner' warning)")
    problems += parallel_problems(vllm_config)
    if config_value(vllm_config, "speculative_config") is not None:
        problems.append("speculative decoding is not supported")
    if config_value(vllm_config, "lora_config") is not None:
        problems.append("LoRA is not supported")
    if config_value(vllm_config, "model_config", "enable_sleep_mode", default=False):
        problems.append("sleep mode is not supported (its allocator bypasses the deterministic region)")
    if config_value(vllm_config, "parallel_config", "enable_dbo", default=False):
        problems.append("dual-batch overlap (enable_dbo) is not supported")
    offload = (config_value(vllm_config, "offload_config", "uva", "cpu_offload_gb", default=0) or 0,
               config_value(vllm_config, "offload_config", "prefetch", "offload_group_size", default=0) or 0)
    if any(isinstance(v, (int, float)) and v > 0 for v in offload):
        problems.append("CPU weight offload is not supported (offloaded weights and prefetch buffers live outside "
                        "the deterministic region)")
    return problems


def parallel_problems(vllm_config: Any) -> list[str]:
    """Tensor parallel (NCCL all-reduce inside the graphs), expert parallel over the
    tensor-parallel group (data parallel 1, no expert load balancing) and data parallel of dense
    models (independent replicas, one archive per rank, started by `vllm serve`) are supported;
    mixture-of-experts replicas through NCCL's all-gather/reduce-scatter backend (ranks.py);
    pipeline parallel, multi-node and Ray are not."""
    problems = []
    pp = config_value(vllm_config, "parallel_config", "pipeline_parallel_size", default=1)
    if pp != 1:
        problems.append(f"pipeline_parallel_size={pp} is not supported (one GPU, tensor, expert or data parallel)")
    if config_value(vllm_config, "parallel_config", "enable_expert_parallel", default=False):
        problems += expert_parallel_problems(vllm_config)
    nnodes = config_value(vllm_config, "parallel_config", "nnodes", default=1)
    if isinstance(nnodes, int) and nnodes > 1:
        problems.append(f"nnodes={nnodes} is not supported (one node)")
    return problems + ranks.replica_problems(vllm_config)


def expert_parallel_problems(vllm_config: Any) -> list[str]:
    """Expert parallel over the tensor-parallel group (data parallel 1: each rank holds some of the
    experts and the layer's output is all-reduced, the collectives of tensor parallel; vLLM uses
    no all-to-all kernel without data parallel) is supported. With data parallel, ranks.py decides
    (NCCL's all-gather and reduce-scatter backend supported; DeepEP and the other kernel backends
    refused, DeepEP designed in docs/multi-gpu.md); expert load balancing moves experts while
    serving."""
    if config_value(vllm_config, "parallel_config", "enable_eplb", default=False):
        return ["expert load balancing (enable_eplb) is not supported (it moves experts between ranks while serving)"]
    return []


def format_refusal(problems: list[str]) -> str:
    return "vllm-foundry cannot run this vLLM configuration: " + "; ".join(problems) + f". Or {OFF_HINT}."


def check_supported(vllm_config: Any, use_v2_model_runner: bool | None = None) -> None:
    """Raises UnsupportedConfigError listing every unsupported setting; returns when all are fine."""
    problems = unsupported_settings(vllm_config, use_v2_model_runner)
    if problems:
        raise UnsupportedConfigError(format_refusal(problems))


def check_resolved_mode(mode: Any) -> None:
    """The V2 runner re-resolves the mode against the attention backend at KV-cache init; raises
    UnsupportedConfigError when that resolution left a mode that is not supported."""
    problem = cudagraph_mode_problem(mode)
    if problem:
        raise UnsupportedConfigError(format_refusal([
            f"the attention backend made vLLM resolve the CUDA-graph mode to {mode_name(mode)}: {problem}"]))
