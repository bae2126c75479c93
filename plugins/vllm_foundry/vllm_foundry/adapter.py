"""The engine adapter: answers foundry_core.engine's hooks from a vLLM ``VllmConfig``.

Everything is read with ``getattr`` and turned into plain JSON values, so the adapter works on any
object of the same shape (the unit tests use a fake config). What goes where:

- model identity (hashed): the model, revision, dtype, quantization, maximum length, load format,
  tokenizer-independent HF config hash vLLM computes itself (``ModelConfig.compute_hash``: the
  factors vLLM considers graph-shaping);
- graph knobs (one fingerprint field each, so a mismatch names the setting): CUDA-graph mode,
  model runner, compilation mode and backend, attention backend, KV-cache block size and dtype,
  the KV sizing inputs (a different --gpu-memory-utilization must not silently reuse the recorded
  KV size), scheduler limits that size the persistent buffers;
- capture sizes (largest first, the order vLLM captures in), parallel sizes, dtype;
- record_state: the KV-cache bytes and blocks SAVE used, plus what the capture patches record
  (graph names, output layout, attention-metadata addresses).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from foundry_core.engine import EngineAdapter
from foundry_core.engine.values import plain

from vllm_foundry import ranks
from vllm_foundry.config import config_value as _get
from vllm_foundry.config import uses_v2_runner

logger = logging.getLogger("foundry.vllm")

__all__ = ["ENGINE_NAME", "GRAPH_ENV", "VllmAdapter", "plain"]

ENGINE_NAME = "vllm"
# Environment variables that change which kernels vLLM builds into the graphs.
GRAPH_ENV = ("VLLM_ATTENTION_BACKEND", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_FLOAT32_MATMUL_PRECISION",
             "VLLM_USE_DEEP_GEMM", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_BATCH_INVARIANT")


class VllmAdapter(EngineAdapter):
    """Answers the foundry hooks for one vLLM worker (one rank). ``state`` is filled by the
    worker and capture patches."""

    logger: ClassVar[logging.Logger] = logger
    distribution: ClassVar[str] = ENGINE_NAME

    def __init__(self, vllm_config: Any, *, engine_version: str | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(engine_version=engine_version, environ=environ)
        self.config = vllm_config

    # ---- required hooks ----------------------------------------------------------------------

    def foundry_engine_identity(self) -> tuple[str, str]:
        return ENGINE_NAME, self.installed_engine_version()

    def foundry_model_identity(self) -> dict[str, Any]:
        mc = _get(self.config, "model_config")
        identity = {
            "model": plain(_get(mc, "model")),
            "revision": plain(_get(mc, "revision")),
            "code_revision": plain(_get(mc, "code_revision")),
            "dtype": plain(_get(mc, "dtype")),
            "quantization": plain(_get(mc, "quantization")),
            "max_model_len": plain(_get(mc, "max_model_len")),
            "architectures": plain(_get(mc, "architectures")),
            "hf_overrides": plain(_get(mc, "hf_overrides")),
            "load_format": plain(_get(self.config, "load_config", "load_format")),
            "additional_config": plain(_get(self.config, "additional_config")),
        }
        compute_hash = getattr(mc, "compute_hash", None)
        if callable(compute_hash):
            identity["vllm_model_hash"] = str(compute_hash())
        return identity

    def foundry_capture_sizes(self) -> list[int]:
        sizes = _get(self.config, "compilation_config", "cudagraph_capture_sizes", default=[]) or []
        return sorted({int(s) for s in sizes}, reverse=True)

    def foundry_parallel_config(self) -> dict[str, int]:
        pc = _get(self.config, "parallel_config")
        tp = int(_get(pc, "tensor_parallel_size", default=1))
        pp = int(_get(pc, "pipeline_parallel_size", default=1))
        # The start's replicas, not the config's data_parallel_size: vLLM sets that to 1 in
        # each replica of a dense model (ranks.py), and every rank must record one topology.
        dp = ranks.replicas(self.config, self._environ)[1]
        ep = tp * dp if _get(pc, "enable_expert_parallel", default=False) else 1
        return {"tp": tp, "pp": pp, "dp": dp, "ep": ep}

    # ---- optional hooks ----------------------------------------------------------------------

    def foundry_dtype(self) -> Any:
        return plain(_get(self.config, "model_config", "dtype"))

    def foundry_graph_knobs(self) -> dict[str, Any]:
        cc = _get(self.config, "compilation_config")
        cache = _get(self.config, "cache_config")
        sched = _get(self.config, "scheduler_config")
        knobs: dict[str, Any] = {
            "cudagraph_mode": plain(_get(cc, "cudagraph_mode")),
            "model_runner": "v2" if uses_v2_runner(self.config) else "v1",
            "compilation_mode": plain(_get(cc, "mode")),
            "compile_backend": plain(_get(cc, "backend")),
            "custom_ops": plain(_get(cc, "custom_ops")),
            "splitting_ops": plain(_get(cc, "splitting_ops")),
            "pass_config": plain(_get(cc, "pass_config")),
            "max_cudagraph_capture_size": plain(_get(cc, "max_cudagraph_capture_size")),
            "attention_backend": plain(_get(self.config, "attention_config", "backend")),
            "kernel_config": plain(_get(self.config, "kernel_config")),
            "block_size": plain(_get(cache, "block_size")),
            "kv_cache_dtype": plain(_get(cache, "cache_dtype")),
            "gpu_memory_utilization": plain(_get(cache, "gpu_memory_utilization")),
            "kv_cache_memory_bytes": plain(_get(cache, "kv_cache_memory_bytes")),
            "num_gpu_blocks_override": plain(_get(cache, "num_gpu_blocks_override")),
            "enable_prefix_caching": plain(_get(cache, "enable_prefix_caching")),
            "max_num_seqs": plain(_get(sched, "max_num_seqs")),
            "max_num_batched_tokens": plain(_get(sched, "max_num_batched_tokens")),
            "enforce_eager": plain(_get(self.config, "model_config", "enforce_eager", default=False)),
        }
        env = {k: self._environ[k] for k in GRAPH_ENV if k in self._environ}
        if env:
            knobs["env"] = env
        return knobs
