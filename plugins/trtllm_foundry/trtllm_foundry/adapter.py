"""The engine adapter: answers foundry_core.engine's hooks from TensorRT-LLM's ``TorchLlmArgs``.

``LLM(...)`` and ``trtllm-serve`` validate their arguments into a ``TorchLlmArgs`` (pydantic) in the
``LLM`` process and hand it to every worker, where ``PyTorchModelEngine.__init__`` receives it as
``llm_args``; by then the validators have filled the derived fields (``cuda_graph_config``'s batch
sizes, ``kv_cache_config``). Everything is read with ``getattr`` and turned into plain JSON values,
so the adapter works on any object of the same shape (the unit tests and the GPU test use simple
namespaces). What goes where:

- model identity (hashed): the model path or name, revision, dtype, quantization, the checkpoint
  format, the tokenizer's and the sequence limits, and a hash of the model directory's
  ``config.json`` when it is a local directory;
- graph knobs (one fingerprint field each, so a mismatch names the setting): the CUDA-graph config,
  the KV-cache config, the allreduce strategy, the attention backend, the scheduler limits that size
  the persistent buffers, the sampler, overlap scheduling, the autotuner switch, MoE and context
  parallel configs, how SAVE ran the warmups, and the environment variables that change kernels;
- capture sizes (largest first, the order TensorRT-LLM captures in), parallel sizes, dtype;
- record_state: the final KV cache (``kv_cache_blocks``: its block count, ``kv_cache_bytes``) and
  what the seams record (the KV sizing inputs, the autotuner's cache, graph names, output layouts,
  input and metadata addresses).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from foundry_core.engine import EngineAdapter
from foundry_core.engine.values import plain  # pydantic settings through model_dump, its default

from trtllm_foundry import options
from trtllm_foundry.modes import name_of, setting

logger = logging.getLogger("foundry.tensorrt_llm")

__all__ = ["ENGINE_NAME", "DISTRIBUTION", "GRAPH_ENV", "KNOB_FIELDS", "TrtllmAdapter", "plain", "capture_sizes",
           "model_config_hash"]

ENGINE_NAME = "tensorrt_llm"
DISTRIBUTION = "tensorrt-llm"
# Environment variables that change which kernels TensorRT-LLM puts in the decode graphs.
GRAPH_ENV = (
    "TRTLLM_ENABLE_PDL", "TLLM_DISABLE_ALLREDUCE_AUTOTUNE", "FORCE_DETERMINISTIC", "TRTLLM_GEN_ATTENTION",
    "TRTLLM_DG_ENABLED", "TRTLLM_DG_JIT_USE_NVCC", "NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
)
# TorchLlmArgs fields that change the captured graphs or the buffers they read.
KNOB_FIELDS = (
    "cuda_graph_config", "kv_cache_config", "allreduce_strategy", "attn_backend", "max_batch_size", "max_num_tokens",
    "max_seq_len", "max_beam_width", "max_input_len", "sampler_type", "disable_overlap_scheduler",
    "enable_chunked_prefill", "enable_autotuner", "moe_config", "cp_config", "enable_attention_dp",
    "enable_layerwise_nvtx_marker", "enable_min_latency", "stream_interval", "garbage_collection_gen0_threshold",
)


def capture_sizes(llm_args: Any) -> list[int]:
    """The decode batch sizes of ``cuda_graph_config`` (filled by TensorRT-LLM's validator), largest
    first, as ``_capture_generation_cuda_graphs`` captures them."""
    config = getattr(llm_args, "cuda_graph_config", None)
    sizes = config.get("batch_sizes") if isinstance(config, Mapping) else getattr(config, "batch_sizes", None)
    return sorted({int(s) for s in sizes or []}, reverse=True)


def model_config_hash(model: Any) -> str | None:
    """sha256 of ``<model>/config.json`` when ``model`` names a local directory that has one."""
    try:
        path = Path(os.fspath(model)).expanduser() / "config.json"
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except (TypeError, OSError):
        return None


class TrtllmAdapter(EngineAdapter):
    """Answers the foundry hooks for one TensorRT-LLM worker (one rank). ``state`` is filled by the
    KV, warmup and capture seams."""

    logger: ClassVar[logging.Logger] = logger
    distribution: ClassVar[str] = DISTRIBUTION

    def __init__(self, llm_args: Any, *, engine_version: str | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(engine_version=engine_version, environ=environ)
        self.llm_args = llm_args

    def installed_engine_version(self) -> str:
        """``engine_version`` when given, else the installed distribution's version, else the
        ``__version__`` of the ``tensorrt_llm`` package this worker imported (a source tree)."""
        try:
            return super().installed_engine_version()
        except ImportError:  # no distribution: the shared fallback looks for a module named "tensorrt-llm"
            return str(getattr(sys.modules.get(ENGINE_NAME), "__version__", "unknown"))

    # ---- required hooks ----------------------------------------------------------------------

    def foundry_engine_identity(self) -> tuple[str, str]:
        return ENGINE_NAME, self.installed_engine_version()

    def foundry_model_identity(self) -> dict[str, Any]:
        a = self.llm_args
        model = setting(a, "model")
        identity = {name: plain(setting(a, name)) for name in (
            "revision", "dtype", "quant_config", "checkpoint_format", "skip_tokenizer_init", "trust_remote_code",
            "max_seq_len", "max_input_len")}
        identity["model"] = plain(str(model) if model is not None else None)
        digest = model_config_hash(model)
        if digest is not None:
            identity["config_json_sha256"] = digest
        return identity

    def foundry_capture_sizes(self) -> list[int]:
        return capture_sizes(self.llm_args)

    def foundry_parallel_config(self) -> dict[str, int]:
        a = self.llm_args
        ep = int(setting(a, "moe_expert_parallel_size", 1))
        return {"tp": int(setting(a, "tensor_parallel_size", 1)), "pp": int(setting(a, "pipeline_parallel_size", 1)),
                "dp": 1, "ep": ep if ep > 0 else 1}

    # ---- optional hooks ----------------------------------------------------------------------

    def foundry_dtype(self) -> Any:
        return plain(setting(self.llm_args, "dtype", "auto"))

    def foundry_graph_knobs(self) -> dict[str, Any]:
        a = self.llm_args
        knobs: dict[str, Any] = {name: plain(getattr(a, name, None)) for name in KNOB_FIELDS}
        knobs["allreduce_strategy"] = name_of(setting(a, "allreduce_strategy", "AUTO"))
        knobs["context_parallel_size"] = int(setting(a, "context_parallel_size", 1))
        knobs["warmup_forwards"] = options.warmup_forwards(self._environ)
        env = {k: self._environ[k] for k in GRAPH_ENV if k in self._environ}
        if env:
            knobs["env"] = env
        return knobs
