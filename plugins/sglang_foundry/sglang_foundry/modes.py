"""Which SGLang configurations sglang-foundry supports, and the refusal for the others.

Supported in this version: one GPU (tensor, pipeline, data, expert, attention-context and
decode-context parallel size 1, one node), or tensor parallel on one node with NCCL's all-reduce
(experimental, ``FOUNDRY_SGLANG_TENSOR_PARALLEL=1``), the decode CUDA graphs of the ``full`` backend
(one torch CUDA graph per batch size), the prefill graphs of the ``breakable`` backend (SGLang's CUDA
default) or none, torch.compile without CUDA-graph trees, no speculative
decoding, no LoRA, no memory saver, no symmetric memory, no batch overlap or PD multiplexing, no
hidden-state outputs, no PD disaggregation, no post-capture KV resizing.

Why each refusal (SGLang 0.5.17 source):

- prefill backends ``full`` (a monolithic graph per token count, with request-slot and
  chunked-prefix variants) and ``tc_piecewise`` (torch.compile pieces): capture paths the plugin
  does not save; ``SGLANG_ENABLE_CUDA_GRAPH_DEDUP``: one executable shared by several segments;
- decode backend other than ``full``: ``breakable`` captures through another backend class;
  ``disabled`` captures nothing, so there is nothing to save or restore;
- torch.compile: supported (``FOUNDRY_SGLANG_TORCH_COMPILE=0`` refuses it). It is compiled in the
  first capture warmup of each size and called only in the warmups and the capture, which LOAD
  replaces, so LOAD needs none of it (on the H200: nothing traced or compiled, outputs identical to
  SAVE's, also on emptied compile caches). Modes with CUDA-graph trees
  (``SGLANG_TORCH_COMPILE_MODE=reduce-overhead|max-autotune``, ``TORCHINDUCTOR_CUDAGRAPHS=1``) record
  Inductor's own graphs in a private pool inside SGLang's capture: refused;
- memory saver: torch_memory_saver preloads its own allocator and maps weights, KV and graphs
  outside the deterministic region;
- symmetric memory, NCCL NVLS, MSCCL++: NCCL memory pools the region cannot back;
- with tensor parallel, every all-reduce path but NCCL's: the custom all-reduce (turned off by the
  plugin), FlashInfer's all-reduce fusion, quantised or fused all-reduces keep peers' addresses or
  kernels of their own in the graphs, which re-making NCCL's calls at LOAD does not cover;
- speculative decoding, LoRA, two-/single-batch overlap, PD multiplexing, hidden-state outputs,
  profile / debug capture: other graph variants, streams or outputs than the one captured set;
- PD disaggregation, elastic EP, hierarchical sparse attention: transfer engines and host/device
  swaps that register or move device memory at run time;
- ``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``: resizes the KV pool after capture;
  ``SGLANG_ENABLE_GRAPH_POOL_PRECARVE`` / ``SGLANG_ENABLE_GRAPH_POOL_BORROW`` (0.5.23): graph-pool
  sizing from the warmups and other users writing into graph-pool blocks;
  ``SGLANG_MOONCAKE_CUSTOM_MEM_POOL``: a custom allocator.

Policy: **refuse**. When Foundry is active (an archive is given and the mode is not ``off``) and
the configuration is not supported, the start fails before the first device allocation of the
scheduler (and already in the main process when the flags are on the command line), naming every
unsupported setting, the supported value and the way out (``--foundry-mode off``). A silent normal
start would hide that every later start pays the full capture. An archive that cannot be used
(missing, stale, corrupt) is different: it falls back to a normal start (see the fallback policy).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from foundry_core.errors import UnsupportedError

from sglang_foundry import options

OFF_HINT = "start SGLang with --foundry-mode off (or FOUNDRY_MODE=off) to run it without Foundry"
PREFILL_FLAG = "--disable-prefill-cuda-graph"
DECODE_BACKEND = "full"
PREFILL_BACKEND = "breakable"
# Why each other prefill backend SGLang 0.5.17 offers is refused.
PREFILL_REFUSED = {
    "full": "one monolithic graph per token count with its own request-slot and chunked-prefix variants, which "
            "this version does not save",
    "tc_piecewise": "torch.compile pieces, compiled inside the capture warmups LOAD skips",
}
DISABLED = "disabled"
_TRUE = ("1", "true", "yes", "y")

# torch.compile modes (SGLANG_TORCH_COMPILE_MODE) without CUDA-graph trees; SGLang's default first.
COMPILE_MODES = ("max-autotune-no-cudagraphs", "default")
_CUDAGRAPH_TREE_MODES = ("reduce-overhead", "max-autotune")

# (field, what to say) for boolean ServerArgs fields that must be off.
_MUST_BE_OFF = (
    ("enable_memory_saver", "--enable-memory-saver preloads torch_memory_saver, whose allocator bypasses the "
                            "deterministic region"),
    ("enable_symm_mem", "--enable-symm-mem allocates NCCL symmetric memory the region cannot back"),
    ("enable_torch_symm_mem", "--enable-torch-symm-mem allocates symmetric memory the region cannot back"),
    ("enable_nccl_nvls", "--enable-nccl-nvls maps NVLink SHARP buffers the region cannot back"),
    ("enable_mscclpp", "--enable-mscclpp registers its own buffers"),
    ("enable_lora", "LoRA (--enable-lora) captures other graph variants"),
    ("enable_two_batch_overlap", "two-batch overlap (--enable-two-batch-overlap) splits the captured batch"),
    ("enable_single_batch_overlap", "single-batch overlap (--enable-single-batch-overlap)"),
    ("enable_pdmux", "PD multiplexing (--enable-pdmux) captures one graph set per stream"),
    ("enable_dp_attention", "DP attention (--enable-dp-attention) needs several ranks"),
    ("enable_return_hidden_states", "--enable-return-hidden-states adds graph outputs"),
    ("enable_profile_cuda_graph", "--enable-profile-cuda-graph profiles the capture"),
    ("debug_cuda_graph", "--debug-cuda-graph needs the breakable backend"),
    ("enable_hisparse", "hierarchical sparse attention (--enable-hisparse) swaps KV between host and device"),
)
_PARALLEL = ("tp_size", "pp_size", "dp_size", "ep_size", "attn_cp_size", "moe_dp_size", "dcp_size", "nnodes")
# With tensor parallel: the all-reduce paths other than NCCL (and the custom all-reduce, which the
# plugin turns off), each put memory or kernels into the graphs that a LOAD cannot make again by
# re-making NCCL's calls (docs/multi-gpu.md, SGLang 0.5.17 tensor parallel).
_TP_MUST_BE_OFF = (
    ("enable_quant_communications", "--enable-quant-communications quantises the all-reduce in kernels of its own"),
    ("enable_aiter_allreduce_fusion", "--enable-aiter-allreduce-fusion fuses the all-reduce into ROCm kernels"),
    ("enable_fused_moe_sum_all_reduce", "--enable-fused-moe-sum-all-reduce all-reduces inside a Triton MoE kernel"),
    ("enable_scattered_sconv", "--enable-scattered-sconv replaces the all-reduce with its own exchange"),
)
_ENV_MUST_BE_OFF = (
    ("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "it resizes the KV pool after capture"),
    ("SGLANG_ENABLE_GRAPH_POOL_PRECARVE", "it sizes the graph pool from the warmups LOAD skips"),
    ("SGLANG_ENABLE_GRAPH_POOL_BORROW", "other users write into free graph-pool blocks"),
    ("SGLANG_ENABLE_CUDA_GRAPH_DEDUP", "it shares one executable among the prefill graphs' segments"),
)


class UnsupportedConfigError(UnsupportedError):
    """SGLang runs with a setting sglang-foundry does not support (the message names it)."""


def setting(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name``, or ``default`` when it is missing or None (ServerArgs differs between releases)."""
    value = getattr(obj, name, None)
    return default if value is None else value


def _configured_backend(config: Any, phase: str) -> Any:
    """``config.<phase>.backend`` of a resolved CudaGraphConfig, or of its dict form."""
    phase_config = config.get(phase) if isinstance(config, Mapping) else getattr(config, phase, None)
    if isinstance(phase_config, Mapping):
        return phase_config.get("backend")
    return getattr(phase_config, "backend", None)


def _flag_backend(server_args: Any, phase: str) -> Any:
    """The backend the raw flags ask for, for a ServerArgs whose cuda_graph_config is unresolved."""
    if setting(server_args, f"disable_{phase}_cuda_graph", False) or setting(server_args, "disable_cuda_graph", False):
        return DISABLED
    return setting(server_args, f"cuda_graph_backend_{phase}")


def graph_backends(server_args: Any) -> tuple[str | None, str | None]:
    """(decode backend, prefill backend) as SGLang resolved them in ``cuda_graph_config`` (0.5.17
    resolves it in ``ServerArgs.__post_init__``), else as the raw flags ask; None where neither
    says (SGLang's default applies)."""
    config = getattr(server_args, "cuda_graph_config", None)
    out = []
    for phase in ("decode", "prefill"):
        backend = _configured_backend(config, phase)
        if backend is None:
            backend = _flag_backend(server_args, phase)
        out.append(None if backend is None else str(backend))
    return out[0], out[1]


def _graph_problems(server_args: Any, environ: Mapping[str, str]) -> list[str]:
    decode, prefill = graph_backends(server_args)
    problems = []
    if decode == DISABLED:
        problems.append("decode CUDA graphs are disabled, so there is nothing to save or restore (drop "
                        "--disable-decode-cuda-graph / --cuda-graph-backend-decode disabled)")
    elif decode not in (None, DECODE_BACKEND):
        problems.append(f"the decode CUDA-graph backend {decode!r} is not supported (supported: {DECODE_BACKEND!r}; "
                        "pass --cuda-graph-backend-decode full)")
    if prefill in (None, PREFILL_BACKEND) and not options.prefill_graphs(environ):
        shown = "the default" if prefill is None else repr(prefill)
        problems.append(f"prefill CUDA graphs ({shown} backend) are turned off in sglang-foundry by "
                        f"{options.PREFILL_GRAPHS_ENV}=0; pass {PREFILL_FLAG}, or unset it")
    elif prefill not in (None, DISABLED, PREFILL_BACKEND):
        why = PREFILL_REFUSED.get(prefill, "it is not one this version restores")
        problems.append(f"the prefill CUDA-graph backend {prefill!r} is not supported: {why} (supported: "
                        f"{PREFILL_BACKEND!r}, SGLang's default, or {PREFILL_FLAG})")
    return problems


def _compile_problems(server_args: Any, environ: Mapping[str, str]) -> list[str]:
    if not setting(server_args, "enable_torch_compile", False):
        return []
    if not options.torch_compile(environ):
        return [f"torch.compile (--enable-torch-compile) is refused: {options.TORCH_COMPILE_ENV}=0; drop the flag, or "
                "unset the variable"]
    problems = []
    mode = environ.get("SGLANG_TORCH_COMPILE_MODE", "").strip()
    if mode and mode not in COMPILE_MODES:
        why = ("records Inductor's own CUDA graphs (CUDA-graph trees) inside SGLang's capture"
               if mode in _CUDAGRAPH_TREE_MODES else "is not a torch.compile mode this version knows")
        problems.append(f"SGLANG_TORCH_COMPILE_MODE={mode} {why}; use {' or '.join(COMPILE_MODES)} (or unset it)")
    if _env_true(environ, "TORCHINDUCTOR_CUDAGRAPHS"):
        problems.append("TORCHINDUCTOR_CUDAGRAPHS=1 makes Inductor record CUDA graphs of its own inside SGLang's capture "
                        "(unset it)")
    return problems


def _parallel_problems(server_args: Any, environ: Mapping[str, str]) -> list[str]:
    """Parallel sizes other than 1 except tensor parallel on one node, which needs
    ``FOUNDRY_SGLANG_TENSOR_PARALLEL=1`` and no all-reduce path besides NCCL."""
    problems = []
    for name in _PARALLEL:
        value = setting(server_args, name, 1)
        if value == 1 or (name == "tp_size" and options.tensor_parallel(environ)):
            continue
        hint = (f" ({options.TENSOR_PARALLEL_ENV}=1 saves and restores it, experimental: not yet run on several GPUs)"
                if name == "tp_size" else " (one GPU, or tensor parallel on one node, in this version)")
        problems.append(f"{name}={value} is not supported{hint}")
    if setting(server_args, "tp_size", 1) == 1:
        return problems
    for name, why in _TP_MUST_BE_OFF:
        if setting(server_args, name, False) is True:
            problems.append(f"{why}; with tensor parallel only NCCL's all-reduce is supported")
    fusion = setting(server_args, "flashinfer_allreduce_fusion_backend")
    if fusion is not None or setting(server_args, "enable_flashinfer_allreduce_fusion", False) is True:
        problems.append(f"FlashInfer's all-reduce fusion ({fusion or 'on'}) keeps a workspace of peer pointers in the "
                        "graphs; pass --enforce-disable-flashinfer-allreduce-fusion")
    return problems


def _env_true(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in _TRUE


def unsupported_settings(server_args: Any, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every setting of ``server_args`` (and of the environment) this version cannot handle, as
    one message each; empty when everything is supported."""
    env = os.environ if environ is None else environ
    problems = _graph_problems(server_args, env) + _compile_problems(server_args, env) + _parallel_problems(server_args,
                                                                                                          env)
    device = setting(server_args, "device", "cuda")
    if device != "cuda":
        problems.append(f"device={device!r} is not supported (CUDA only)")
    if setting(server_args, "speculative_algorithm") is not None:
        problems.append(f"speculative decoding (--speculative-algorithm {server_args.speculative_algorithm}) is not "
                        "supported")
    if setting(server_args, "lora_paths") and not setting(server_args, "enable_lora", False):
        problems.append("LoRA adapters (--lora-paths) are not supported")
    for name, why in _MUST_BE_OFF:
        if setting(server_args, name, False) is True:
            problems.append(f"{why}; it is not supported")
    disaggregation = setting(server_args, "disaggregation_mode", "null")
    if disaggregation not in ("null", None):
        problems.append(f"PD disaggregation (--disaggregation-mode {disaggregation}) is not supported")
    if setting(server_args, "elastic_ep_backend") is not None:
        problems.append("elastic expert parallelism (--elastic-ep-backend) is not supported")
    load_mode = setting(server_args, "startup_weight_load_mode", "serial")
    if load_mode != "serial":
        problems.append(f"--startup-weight-load-mode {load_mode} commits weights after capture; use serial")
    for name, why in _ENV_MUST_BE_OFF:
        if _env_true(env, name):
            problems.append(f"{name}={env[name]} is not supported: {why} (unset it)")
    if env.get("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "").strip():
        problems.append("SGLANG_MOONCAKE_CUSTOM_MEM_POOL is not supported: its allocator bypasses the deterministic "
                        "region (unset it)")
    return problems


def format_refusal(problems: list[str]) -> str:
    return "sglang-foundry cannot run this SGLang configuration: " + "; ".join(problems) + f". Or {OFF_HINT}."


def check_supported(server_args: Any, environ: Mapping[str, str] | None = None) -> None:
    """Raises UnsupportedConfigError listing every unsupported setting; returns when all are fine."""
    problems = unsupported_settings(server_args, environ)
    if problems:
        raise UnsupportedConfigError(format_refusal(problems))


def refuse(problem: str) -> UnsupportedConfigError:
    """The error for one unsupported setting found at a seam (raise it)."""
    return UnsupportedConfigError(format_refusal([problem]))
