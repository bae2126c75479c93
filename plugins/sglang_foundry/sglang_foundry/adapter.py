"""The engine adapter: answers foundry_core.engine's hooks from SGLang's ``ServerArgs`` (and the
target ``ModelConfig`` when the NCCL seam has it).

SGLang 0.5.17 resolves ``ServerArgs`` in ``__post_init__`` (in the main process, before the
schedulers are spawned), so the fields the scheduler sees are the final values, including those
SGLang derives from the GPU's memory (``mem_fraction_static``, ``chunked_prefill_size``,
``max_running_requests``, the decode batch sizes). Everything is read with ``getattr`` and turned
into plain JSON values, so the adapter works on any object of the same shape (the unit tests use
a fake). What goes where:

- model identity (hashed): model path, revision, dtype, quantization, context length, load format,
  model implementation, JSON overrides, architectures, and a hash of the Hugging Face config SGLang
  loaded (SGLang computes no model-config hash of its own);
- graph knobs (one fingerprint field each, so a mismatch names the setting): CUDA-graph config
  and, on its own, the prefill CUDA-graph backend (``disabled`` when off),
  attention and sampling backends, KV dtype, page size, the KV sizing inputs (memory fraction, max
  total tokens), scheduler limits that size the persistent buffers (max running requests, chunked
  prefill size), kernel switches, the environment variables that change kernels, and how SAVE ran
  the capture warmups;
- capture sizes (largest first, the order SGLang captures in), parallel sizes, dtype;
- record_state: the KV pool SAVE allocated (bytes, and tokens as ``kv_cache_blocks``: SGLang counts
  KV slots in tokens), plus what the worker and capture seams record (the MemoryPoolConfig fields,
  graph names, output layouts, attention-metadata addresses).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from foundry_core.engine import EngineAdapter, config_hash, values
from foundry_core.errors import InvalidArgumentError

from sglang_foundry import options
from sglang_foundry.modes import PREFILL_BACKEND, graph_backends, setting

logger = logging.getLogger("foundry.sglang")

__all__ = ["ENGINE_NAME", "GRAPH_ENV", "KNOB_FIELDS", "SglangAdapter", "hf_config_hash", "inductor_settings", "plain"]

ENGINE_NAME = "sglang"
# Environment variables that change which kernels SGLang builds into the decode graphs.
GRAPH_ENV = (
    "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS", "SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE",
    "SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE", "SGLANG_ENABLE_DETERMINISTIC_INFERENCE",
    "SGLANG_ENABLE_TORCH_COMPILE", "SGLANG_TORCH_COMPILE_MODE", "SGLANG_ENABLE_JIT_DEEPGEMM",
    "SGLANG_USE_SGL_FA3_KERNEL", "SGLANG_FLASHINFER_WORKSPACE_SIZE", "SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE",
    "SGLANG_USE_AITER_UNIFIED_ATTN", "SGLANG_FORCE_FP8_MARLIN", "SGLANG_USE_CUSTOM_TRITON_KERNEL_CACHE",
    "NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
)
# ServerArgs fields that change the captured graphs or the buffers they read.
KNOB_FIELDS = (
    "attention_backend", "decode_attention_backend", "prefill_attention_backend", "sampling_backend",
    "kv_cache_dtype", "page_size", "mem_fraction_static", "max_total_tokens", "max_running_requests",
    "chunked_prefill_size", "max_prefill_tokens", "disable_cuda_graph_padding", "triton_attention_num_kv_splits",
    "triton_attention_reduce_in_fp32", "enable_deterministic_inference", "enable_fp32_lm_head", "torchao_config",
    "enable_tf32_matmul", "disable_radix_cache", "enable_mixed_chunk", "enable_unified_memory",
)


# ``value`` as JSON-able data with a stable text (foundry_core.engine.values.plain); SGLang's
# msgspec-style configs are read through their ``to_dict`` when they have no ``model_dump``.
plain = functools.partial(values.plain, dumps=("model_dump", "to_dict"))


# Inductor variables that name where it caches, how many threads compile, or what it logs: they do
# not change the kernels it builds, so they stay out of the fingerprint.
_INDUCTOR_HOST_ONLY = ("CACHE", "THREADS", "DEBUG", "TRACE", "LOG")


def inductor_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``TORCHINDUCTOR_*`` variables that can change what Inductor builds (a compiled start's
    fingerprint)."""
    return {k: v for k, v in sorted(environ.items())
            if k.startswith("TORCHINDUCTOR_") and not any(word in k for word in _INDUCTOR_HOST_ONLY)}


def hf_config_hash(model_config: Any) -> str | None:
    """sha256 of the Hugging Face config SGLang loaded for the model (after its overrides), or
    None when there is none to read."""
    hf_config = getattr(model_config, "hf_config", None)
    if hf_config is None:
        return None
    data = plain(hf_config)
    if not isinstance(data, Mapping):
        return None
    try:
        return config_hash(data)
    except InvalidArgumentError:  # a value with no stable JSON form: leave the hash out
        logger.debug("foundry: the model's HF config has no stable JSON form; not hashed")
        return None


class SglangAdapter(EngineAdapter):
    """Answers the foundry hooks for one SGLang scheduler (one rank). ``state`` is filled by the
    worker and capture seams."""

    logger: ClassVar[logging.Logger] = logger
    distribution: ClassVar[str] = ENGINE_NAME

    def __init__(self, server_args: Any, model_config: Any = None, *, engine_version: str | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(engine_version=engine_version, environ=environ)
        self.server_args = server_args
        self.model_config = model_config

    # ---- required hooks ----------------------------------------------------------------------

    def foundry_engine_identity(self) -> tuple[str, str]:
        return ENGINE_NAME, self.installed_engine_version()

    def foundry_model_identity(self) -> dict[str, Any]:
        sa, mc = self.server_args, self.model_config
        identity = {
            "model_path": plain(setting(sa, "model_path")),
            "revision": plain(setting(sa, "revision")),
            "dtype": plain(setting(sa, "dtype")),
            "quantization": plain(setting(sa, "quantization")),
            "context_length": plain(setting(mc, "context_len", setting(sa, "context_length"))),
            "load_format": plain(setting(sa, "load_format")),
            "model_impl": plain(setting(sa, "model_impl")),
            "json_model_override_args": plain(setting(sa, "json_model_override_args")),
            "architectures": plain(setting(getattr(mc, "hf_config", None), "architectures")),
        }
        digest = hf_config_hash(mc)
        if digest is not None:
            identity["hf_config_sha256"] = digest
        return identity

    def foundry_capture_sizes(self) -> list[int]:
        config = getattr(self.server_args, "cuda_graph_config", None)
        decode = config.get("decode") if isinstance(config, Mapping) else getattr(config, "decode", None)
        sizes = decode.get("bs") if isinstance(decode, Mapping) else getattr(decode, "bs", None)
        if not sizes:
            sizes = setting(self.server_args, "cuda_graph_bs_decode", [])
        return sorted({int(s) for s in sizes or []}, reverse=True)

    def foundry_parallel_config(self) -> dict[str, int]:
        sa = self.server_args
        return {"tp": int(setting(sa, "tp_size", 1)), "pp": int(setting(sa, "pp_size", 1)),
                "dp": int(setting(sa, "dp_size", 1)), "ep": int(setting(sa, "ep_size", 1))}

    # ---- optional hooks ----------------------------------------------------------------------

    def foundry_dtype(self) -> Any:
        resolved = getattr(self.model_config, "dtype", None)
        return plain(resolved if resolved is not None else setting(self.server_args, "dtype"))

    def foundry_graph_knobs(self) -> dict[str, Any]:
        sa = self.server_args
        knobs: dict[str, Any] = {name: plain(getattr(sa, name, None)) for name in KNOB_FIELDS}
        knobs["cuda_graph_config"] = plain(getattr(sa, "cuda_graph_config", None))
        # Its own field, so that an archive saved with prefill graphs off (or on) names it at LOAD.
        knobs["prefill_cuda_graph"] = graph_backends(sa)[1] or PREFILL_BACKEND
        knobs["warmup_forwards"] = options.warmup_forwards(self._environ)
        env = {k: self._environ[k] for k in GRAPH_ENV if k in self._environ}
        if env:
            knobs["env"] = env
        if setting(sa, "enable_torch_compile", False):  # absent otherwise: earlier archives keep their fingerprint
            knobs["torch_compile"] = {"max_bs": plain(getattr(sa, "torch_compile_max_bs", None)),
                                      "inductor_env": inductor_settings(self._environ)}
        return knobs
