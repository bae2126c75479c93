"""The seams of a TensorRT-LLM worker's start-up before its warmup: the model engine and KV sizing.

In start-up order (TensorRT-LLM 1.2 ``create_py_executor``, as docs/engine-trtllm.md describes it):

1. ``PyTorchModelEngine.__init__`` (before the weights load): refuses an unsupported configuration
   or a worker without the preload, starts the runtime (``session.begin()``: the region is set),
   and seals the determinism boundary at once (one GPU: no communicator is brought up in between).
   LOAD starts handing the kernel images to the driver on a thread there, while the weights load.
   Both sides then make PyTorch's cuBLAS workspaces in the region (``create_blas_workspaces``).
   The autotuner's cache file is pointed into the process's scratch directory unless the user set
   ``TLLM_AUTOTUNER_CACHE_PATH``.
2. ``KvCacheCreator.try_prepare_estimation``: LOAD sets ``kv_cache_config.max_tokens`` and
   ``max_gpu_total_bytes`` to what the final KV cache was built from at SAVE and returns False: no
   estimation pass (no throwaway KV cache and executor, no warmup and captures in it, no profiling
   run). SAVE lets TensorRT-LLM decide and, when it estimates, runs the pass paused.
3. ``KvCacheCreator.configure_kv_cache_capacity``: the profiling run (SAVE: inside the pause).
4. ``KvCacheCreator.teardown_managers``: the end of the estimation pass: SAVE's pause ends.
5. ``KvCacheCreator.build_managers`` (the final one): records the KV sizing inputs and the KV cache
   it built (blocks, bytes); LOAD checks it got the recorded one, else falls back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from foundry_core.engine import Mode, preload_active
from foundry_core.engine.mode import resolve_settings
from foundry_core.engine.logs import setup_logging
from foundry_core.errors import MismatchError, StateError

from trtllm_foundry import installing, modes, runtime
from trtllm_foundry.runtime import Phase

logger = logging.getLogger("foundry.tensorrt_llm")

KV_INPUTS_KEY = "kv_cache_inputs"
KV_MANAGER = "KV_CACHE_MANAGER"
GIB = 1 << 30

__all__ = ["WRAPPERS", "install", "check_worker_process", "kv_manager", "kv_cache_size", "kv_inputs"]


# ---- 1. model engine ---------------------------------------------------------------------------------


def check_worker_process(llm_args: Any) -> None:
    """Refuses (before the weights load) what this version cannot do, and a worker without the preload."""
    modes.check_supported(llm_args)
    if not preload_active():
        raise StateError(
            f"trtllm-foundry: libfoundry.so is not preloaded in this TensorRT-LLM worker (pid {os.getpid()}), so the "
            "deterministic region would miss PyTorch's and TensorRT-LLM's allocations. The preload must be in the "
            "environment before trtllm-serve or the script starts (MPI starts the workers from it): run "
            "`foundry run -- trtllm-serve MODEL ...` (or `foundry run -- python script.py`), or export "
            "LD_PRELOAD=$(foundry preload-path) first; under mpirun pass -x LD_PRELOAD -x FOUNDRY_ARCHIVE. Or "
            f"{modes.OFF_HINT}.")


def _rank(mapping: Any) -> int:
    return int(getattr(mapping, "rank", 0) or 0)


def wrap_engine_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> Any:
        first = runtime.current()
        if first is not None:  # a second LLM in this process (a draft model engine was refused earlier)
            logger.warning("foundry: a second TensorRT-LLM model engine in this process (pid %d) starts without "
                           "Foundry: trtllm-foundry handles one model engine per process (the first one's archive: "
                           "%s); start it in a fresh process to use an archive", os.getpid(), first.session.archive)
            return original(self, *args, **kwargs)
        if resolve_settings().mode is Mode.OFF:
            return original(self, *args, **kwargs)
        llm_args = kwargs.get("llm_args")
        setup_logging()
        check_worker_process(llm_args)
        rt = runtime.start(llm_args, _rank(kwargs.get("mapping")))
        if rt is None:
            return original(self, *args, **kwargs)
        rt.boundary()
        if rt.active:
            rt.create_blas_workspaces()
            rt.use_autotuner_cache()
        with runtime.timed("PyTorchModelEngine.__init__ (weights, buffers, CUDA-graph runner)"):
            return original(self, *args, **kwargs)

    return __init__


# ---- 2.-5. KV sizing ------------------------------------------------------------------------------


def kv_inputs(creator: Any) -> dict[str, Any]:
    """What the final KV cache is built from: ``max_tokens`` and ``max_gpu_total_bytes`` of the
    creator's KvCacheConfig (the estimation pass writes both)."""
    config = getattr(creator, "_kv_cache_config", None)
    return {"max_tokens": getattr(config, "max_tokens", None),
            "max_gpu_total_bytes": getattr(config, "max_gpu_total_bytes", None)}


def kv_manager(resources: Mapping[Any, Any]) -> Any:
    """The KV-cache manager in ``resources`` (keyed by ResourceManagerType.KV_CACHE_MANAGER)."""
    for key, value in resources.items():
        if getattr(key, "name", key) == KV_MANAGER:
            return value
    return None


def kv_cache_size(manager: Any) -> tuple[int, int]:
    """(blocks, bytes) of a KV-cache manager, from ``get_kv_cache_stats()`` (max_num_blocks,
    allocated_bytes); (0, 0) when it does not say."""
    stats_of = getattr(manager, "get_kv_cache_stats", None)
    stats = stats_of() if callable(stats_of) else None
    return int(getattr(stats, "max_num_blocks", 0) or 0), int(getattr(stats, "allocated_bytes", 0) or 0)


def _recorded_inputs(rt: runtime.WorkerRuntime) -> Mapping[str, Any] | None:
    inputs = rt.recorded_adapter_state().get(KV_INPUTS_KEY)
    return inputs if isinstance(inputs, Mapping) else None


def wrap_try_prepare_estimation(original: Callable[..., Any]) -> Callable[..., Any]:
    def try_prepare_estimation(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None or not rt.region_open or rt.phase is not Phase.INIT:
            return original(self, *args, **kwargs)
        if rt.mode is Mode.LOAD:
            inputs = _recorded_inputs(rt)
            if inputs is None:
                rt.fall_back(MismatchError("the archive's engine state records no KV-cache sizing inputs"))
            else:
                config = self._kv_cache_config
                config.max_tokens = inputs.get("max_tokens")
                config.max_gpu_total_bytes = inputs.get("max_gpu_total_bytes") or 0
                rt.phase = Phase.FINAL
                rt.skipped("the KV-cache estimation pass (throwaway executor, warmup, captures, profiling run)")
                logger.info("foundry: KV cache sized as at SAVE (max_tokens=%s, max_gpu_total_bytes=%s)",
                            config.max_tokens, config.max_gpu_total_bytes)
                return False
        estimating = original(self, *args, **kwargs)
        if not rt.region_open:
            return estimating
        if estimating and rt.mode is Mode.SAVE:
            rt.begin_estimation()
        else:
            rt.phase = Phase.FINAL
        return estimating

    return try_prepare_estimation


def wrap_configure(original: Callable[..., Any]) -> Callable[..., Any]:
    def configure_kv_cache_capacity(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is not None and rt.region_open and rt.mode is Mode.LOAD:
            logger.warning("foundry: TensorRT-LLM profiles the KV cache although LOAD skipped the estimation pass")
        return original(self, *args, **kwargs)

    return configure_kv_cache_capacity


def wrap_teardown(original: Callable[..., Any]) -> Callable[..., Any]:
    def teardown_managers(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            rt = runtime.current()
            if rt is not None and rt.phase is Phase.ESTIMATION:
                rt.end_estimation()

    return teardown_managers


def _check_kv(rt: runtime.WorkerRuntime, blocks: int, nbytes: int) -> None:
    state = rt.session.recorded_state()
    assert state is not None
    if (blocks, nbytes) != (state.kv_cache_blocks, state.kv_cache_bytes):
        rt.fall_back(MismatchError(
            f"TensorRT-LLM built a KV cache of {blocks} blocks ({nbytes / GIB:.2f} GiB); the archive was saved with "
            f"{state.kv_cache_blocks} blocks ({state.kv_cache_bytes / GIB:.2f} GiB)"))


def wrap_build_managers(original: Callable[..., Any]) -> Callable[..., Any]:
    def build_managers(self: Any, resources: Any, estimating_kv_cache: bool = False, *args: Any,
                       **kwargs: Any) -> Any:
        rt = runtime.current()
        final = (rt is not None and rt.region_open and not estimating_kv_cache
                 and rt.phase in (Phase.INIT, Phase.FINAL))
        inputs = kv_inputs(self) if final else None
        result = original(self, resources, estimating_kv_cache, *args, **kwargs)
        if not final or rt is None:
            return result
        rt.phase = Phase.FINAL
        manager = kv_manager(resources)
        blocks, nbytes = kv_cache_size(manager)
        if not blocks:
            logger.warning("foundry: the size of the KV cache TensorRT-LLM built cannot be read (%s), so LOAD cannot "
                           "compare it with SAVE's", f"no {KV_MANAGER} in its resources" if manager is None
                           else "get_kv_cache_stats() gives no max_num_blocks")
        if rt.mode is Mode.LOAD:
            _check_kv(rt, blocks, nbytes)
        rt.adapter.state.update({"kv_cache_blocks": blocks, "kv_cache_bytes": nbytes, KV_INPUTS_KEY: inputs})
        logger.info("foundry: KV cache of %d blocks, %.2f GiB", blocks, nbytes / GIB)
        return result

    return build_managers


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "engine.init": wrap_engine_init,
    "kv.prepare_estimation": wrap_try_prepare_estimation,
    "kv.configure": wrap_configure,
    "kv.teardown": wrap_teardown,
    "kv.build": wrap_build_managers,
}


def install(module: str | None = None) -> list[str]:
    """Wraps the worker seams (those of ``module`` when given); SeamError names a missing one."""
    return installing.install_wrappers(WRAPPERS, module)
