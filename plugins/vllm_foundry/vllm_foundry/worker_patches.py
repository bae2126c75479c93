"""The seams on vLLM's GPU worker (``vllm/v1/worker/gpu_worker.py``) and the V2 runner's warmup.

In startup order (vLLM 0.25.0 line numbers in ``seams.py``'s contract table):

1. ``Worker.init_device``: refuses an unsupported configuration or a worker without the preload,
   before the first device allocation; after it, checks that the session began.
2. ``init_worker_distributed_environment`` (module function, called by name from init_device once
   the device is set): ``session.begin()`` (region set) before NCCL, NCCL's bring-up paused
   (outside the region), the determinism boundary after; tensor parallel all-reduces through NCCL.
3. ``Worker.determine_available_memory``: LOAD returns the KV-cache bytes SAVE recorded (no
   ``profile_run``, no CUDA-graph memory profiling); SAVE profiles as vLLM does, paused. In mode
   load or auto, every rank first answers whether it LOADs (ranks.py): one that fell back alone
   would profile with collectives its restoring peers never join. Then both sides allocate
   vLLM's shared workspace in the region (workspace.py: the profile grew it outside).
4. ``Worker.initialize_from_config``: records the KV-cache block count; LOAD checks it.
5. ``Worker.compile_or_warm_up_model``: the WARMUP phase, after the ranks agree again (a rank may
   have fallen back at step 4). Inside it, ``GPUModelRunner._dummy_run``
   (compile warmup) and ``kernel_warmup`` are skipped by LOAD and run paused by SAVE;
   ``warmup_kernels`` (V2 JIT warmup) runs paused while the region is open, normally after it;
   ``FOUNDRY_VLLM_JIT_WARMUP=0`` makes LOAD skip it.
6. ``GPUModelRunner.capture_model``: the CAPTURE phase (see capture_patches); the region ends
   when it returns, on both sides.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from foundry_core.engine import Mode, preload_active, resolve_settings
from foundry_core.errors import MismatchError, StateError

from vllm_foundry import modes, patching, ranks, runtime, workspace
from vllm_foundry.runtime import Phase

logger = logging.getLogger("foundry.vllm")

# ---- 1. init_device ------------------------------------------------------------------------


def check_worker_process(worker: Any) -> None:
    """Refuses (before any device work) what this version cannot do; see modes.py."""
    vllm_config = getattr(worker, "vllm_config", None)
    modes.check_supported(vllm_config, modes.uses_v2_runner(vllm_config, worker))
    if not preload_active():
        raise StateError(
            f"vllm-foundry: libfoundry.so is not preloaded in this vLLM worker process (pid {os.getpid()}), so the "
            "deterministic region would miss PyTorch's allocations. The plugin sets LD_PRELOAD before vLLM starts its "
            "engine process; VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine in the first process, which started "
            f"without it: leave multiprocessing on, or start with `foundry run -- vllm ...`. Or {modes.OFF_HINT}.")


def wrap_init_device(original: Callable[..., Any]) -> Callable[..., Any]:
    def init_device(self: Any, *args: Any, **kwargs: Any) -> Any:
        if runtime.current() is not None or resolve_settings().mode is Mode.OFF:
            return original(self, *args, **kwargs)
        check_worker_process(self)
        result = original(self, *args, **kwargs)
        rt = runtime.current()
        if rt is None:
            raise patching.SeamError(
                f"vllm-foundry: Worker.init_device returned without calling init_worker_distributed_environment in "
                f"vLLM {patching.vllm_version()}; the session could not begin before NCCL. {modes.OFF_HINT}")
        rt.worker = self
        return result

    return init_device


# ---- 2. NCCL bring-up ------------------------------------------------------------------------


def wrap_init_distributed(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def init_worker_distributed_environment(*args: Any, **kwargs: Any) -> Any:
        if runtime.current() is not None:  # a later bring-up (elastic EP): not ours to track
            return original(*args, **kwargs)
        bound = signature.bind_partial(*args, **kwargs).arguments
        rt = runtime.start(bound["vllm_config"], ranks.global_rank(bound["vllm_config"], int(bound["rank"])))
        if rt is None:
            return original(*args, **kwargs)
        use_nccl_all_reduce(bound["vllm_config"])
        # NCCL's communicators and connections stay outside the region: their allocations
        # (some from NCCL's proxy thread) differ between runs. Graphs name them by the calls
        # that launched NCCL, which LOAD makes again (docs/multi-gpu.md).
        with rt.paused():
            result = original(*args, **kwargs)
        rt.boundary()
        return result

    return init_worker_distributed_environment


def use_nccl_all_reduce(vllm_config: Any) -> None:
    """Tensor parallel all-reduces through NCCL only. vLLM's custom all-reduce and its
    symmetric-memory all-reduce exchange IPC handles of buffers and bake the peers' mappings
    into the graphs, which a fresh process cannot reproduce."""
    parallel = getattr(vllm_config, "parallel_config", None)
    if parallel is None or int(getattr(parallel, "tensor_parallel_size", 1) or 1) == 1:
        return
    if not getattr(parallel, "disable_custom_all_reduce", False):
        logger.info("foundry: custom all-reduce off (tensor parallel all-reduces through NCCL)")
        parallel.disable_custom_all_reduce = True
    os.environ["VLLM_ALLREDUCE_USE_SYMM_MEM"] = "0"


# ---- 3. memory profiling -----------------------------------------------------------------------


def wrap_determine_available_memory(original: Callable[..., Any]) -> Callable[..., Any]:
    def determine_available_memory(self: Any, *args: Any, **kwargs: Any) -> int:
        rt = runtime.current()
        if rt is None:
            return original(self, *args, **kwargs)
        kv_bytes = _agreed_kv_bytes(rt) if ranks.may_load(rt) else None
        if kv_bytes is not None:
            workspace.place_in_region(rt)
            self.available_kv_cache_memory_bytes = kv_bytes
            return kv_bytes
        rt.wait_caches()  # the profile's forward is the model's first: it reads the compile cache
        if not rt.region_open:
            return original(self, *args, **kwargs)
        with runtime.timed("memory profiling"), rt.paused():
            result = original(self, *args, **kwargs)
        workspace.place_in_region(rt)
        rt.adapter.state["kv_cache_bytes"] = int(result)
        return result

    return determine_available_memory


def _loading(rt: runtime.WorkerRuntime) -> bool:
    """Whether this rank is still loading (it has not fallen back, and the region is open)."""
    return rt.mode is Mode.LOAD and rt.region_open


def _agreed_kv_bytes(rt: runtime.WorkerRuntime) -> int | None:
    """LOAD's first agreement: the recorded KV-cache bytes when every rank LOADs and has the free
    memory for them (profiling is skipped), else None (this rank profiles, after falling back if
    it was loading). Every rank answers, also one that fell back already (its archive, its
    determinism boundary): it profiles with forwards that meet the others in collectives."""
    loading = _loading(rt)
    kv_bytes = need = free = 0
    if loading:
        state = rt.session.recorded_state()
        assert state is not None  # a LOAD session holds the archive's state
        kv_bytes, free = int(state.kv_cache_bytes), rt.device.free_memory()
        need = kv_bytes + workspace.recorded_bytes(state.adapter)  # the workspace is placed before the KV cache
    if ranks.all_ranks(rt, loading and free >= need):  # True only where this rank loads
        rt.skipped("memory profiling (profile_run, CUDA-graph memory estimate)")
        rt.adapter.state["kv_cache_bytes"] = kv_bytes
        logger.info("foundry: KV cache of %d bytes, as recorded at SAVE", kv_bytes)
        return kv_bytes
    if loading:
        rt.fall_back(MismatchError(
            f"the GPU has {free} bytes free, the archive's KV cache and vLLM's workspace need {need}" if free < need
            else "another rank does not LOAD (its archive, its determinism boundary, or its free memory for the "
                 "archive's KV cache)"))
    return None


# ---- 4. KV cache ---------------------------------------------------------------------------


def wrap_initialize_from_config(original: Callable[..., Any]) -> Callable[..., Any]:
    def initialize_from_config(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is not None and rt.region_open:
            blocks = int(kv_cache_config.num_blocks)
            if rt.mode is Mode.LOAD:
                state = rt.session.recorded_state()
                assert state is not None
                if blocks != state.kv_cache_blocks:
                    rt.fall_back(MismatchError(f"vLLM sized the KV cache at {blocks} blocks, the archive was saved "
                                               f"with {state.kv_cache_blocks}"))
            rt.adapter.state["kv_cache_blocks"] = blocks
        return original(self, kv_cache_config, *args, **kwargs)

    return initialize_from_config


# ---- 5. warmup -------------------------------------------------------------------------------


def wrap_compile_or_warm_up_model(original: Callable[..., Any]) -> Callable[..., Any]:
    def compile_or_warm_up_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None:
            return original(self, *args, **kwargs)
        rt.wait_caches()  # the warmup's forwards read the compile cache
        if ranks.may_load(rt):
            _warmup_agreed(rt)
        # finish() at the end is a no-op after the capture phase ended the region
        with rt.in_phase(Phase.WARMUP, Phase.SERVING,
                         "compile_or_warm_up_model (warmup, capture or restore, JIT warmup)"):
            result = original(self, *args, **kwargs)
        _after_warmup(rt)
        return result

    return compile_or_warm_up_model


def _after_warmup(rt: runtime.WorkerRuntime) -> None:
    """SAVE carries the compile caches the start used (the JIT warmup's Triton kernels are among
    them); LOAD says what it took from the archive's."""
    if rt.mode is Mode.SAVE:
        rt.carry_caches_out()
    elif (summary := rt.seeded_summary()) is not None:
        logger.info("foundry: %s", summary)


def _warmup_agreed(rt: runtime.WorkerRuntime) -> None:
    """LOAD's second agreement, before the first warmup forward: a rank that fell back since the
    first (its KV-cache blocks) runs the compile and kernel warmups, with collectives, that LOAD
    skips; its peers then fall back too."""
    loading = _loading(rt)
    if not ranks.all_ranks(rt, loading) and loading:
        rt.fall_back(MismatchError("another rank does not LOAD (it fell back before the warmup)"))


def _in_warmup(rt: runtime.WorkerRuntime | None) -> bool:
    return rt is not None and rt.phase is Phase.WARMUP and rt.region_open


def _skips_warmups(rt: runtime.WorkerRuntime) -> bool:
    """LOAD skips the compile and kernel warmups unless FOUNDRY_VLLM_LOAD_WARMUPS=1."""
    return rt.mode is Mode.LOAD and not runtime.env_flag(runtime.LOAD_WARMUPS_ENV, default=False)


def wrap_dummy_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def _dummy_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if not _in_warmup(rt):
            return original(self, *args, **kwargs)
        assert rt is not None
        if _skips_warmups(rt):
            rt.skipped("a compile-warmup forward")
            return None, None
        with runtime.timed("a compile-warmup forward"), rt.paused():
            return original(self, *args, **kwargs)

    return _dummy_run


def wrap_kernel_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    def kernel_warmup(*args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None or not rt.region_open:
            return original(*args, **kwargs)
        if _skips_warmups(rt):
            rt.skipped("kernel warmup (JIT, autotuning)")
            return None
        with runtime.timed("kernel warmup"), rt.paused():
            return original(*args, **kwargs)

    return kernel_warmup


def wrap_warmup_kernels(original: Callable[..., Any]) -> Callable[..., Any]:
    def warmup_kernels(*args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None or not rt.active:
            return original(*args, **kwargs)
        if rt.mode is Mode.LOAD and not runtime.env_flag(runtime.JIT_WARMUP_ENV):
            if rt.region_open:
                rt.skipped(f"vLLM's JIT warmup ({runtime.JIT_WARMUP_ENV}=0)")
            else:
                logger.info("foundry: LOAD skips vLLM's JIT warmup (%s=0)", runtime.JIT_WARMUP_ENV)
            return None
        with runtime.timed("vLLM's JIT warmup (warmup_kernels: one prefill and one decode step)"), rt.paused():
            return original(*args, **kwargs)

    return warmup_kernels


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "worker.init_device": wrap_init_device,
    "worker.init_distributed": wrap_init_distributed,
    "worker.determine_available_memory": wrap_determine_available_memory,
    "worker.initialize_from_config": wrap_initialize_from_config,
    "worker.compile_or_warm_up_model": wrap_compile_or_warm_up_model,
    "worker.kernel_warmup": wrap_kernel_warmup,
    "worker.warmup_kernels": wrap_warmup_kernels,
    "runner.dummy_run": wrap_dummy_run,
}


def install() -> None:
    """Wraps every worker seam; SeamError names the first one missing in the installed vLLM."""
    for name, make in WRAPPERS.items():
        patching.install(name, make)
