"""The seams of an SGLang scheduler's start-up before capture: NCCL, KV cache, kernel warmup.

In start-up order (SGLang 0.5.17; file:line in docs/engine-sglang.md):

1. ``bootstrap._init_parallel_groups`` (called by name from ``init_torch_distributed``, once the
   device is set, never for a draft worker): refuses an unsupported configuration or a scheduler
   without the preload, then ``session.begin()`` (region set) before NCCL, and the determinism
   boundary when it returns. LOAD starts computing Triton's cache key on a thread here
   (:mod:`foundry_core.engine.triton_key`): the warmup it skips is where SGLang computed it. The
   compile caches carried in the archive start here too (:mod:`sglang_foundry.jit_caches`).
2. ``KVCacheConfigurator._resolve_memory_pool_config``: LOAD returns the ``MemoryPoolConfig`` SAVE
   recorded (no profiling); SAVE profiles as SGLang does, paused, and records the config's fields.
3. ``ModelRunner.alloc_memory_pool``: records the KV pool SGLang allocated (tokens, bytes); LOAD
   checks it is the recorded one.
4. ``BaseRunner.warmup`` (once per process, first from ``EagerRunner.__init__`` in the capture
   phase): LOAD skips it, SAVE runs it paused.
5. ``ModelRunner.post_capture_resize_kv_pool``: refused (the KV pool must not change after capture).

The capture phase itself is in capture_patches.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from foundry_core.engine import Mode, preload_active, resolve_settings, warm_triton_key
from foundry_core.errors import MismatchError, StateError

from sglang_foundry import jit_caches, modes, patching, ranks, runtime

logger = logging.getLogger("foundry.sglang")

POOL_CONFIG_KEY = "memory_pool_config"
GIB = 1 << 30

# ---- 1. NCCL bring-up ------------------------------------------------------------------------


def check_scheduler_process(server_args: Any) -> None:
    """Refuses (before any NCCL or model work) what this version cannot do; see modes.py."""
    modes.check_supported(server_args)
    if not preload_active():
        raise StateError(
            f"sglang-foundry: libfoundry.so is not preloaded in this SGLang scheduler process (pid {os.getpid()}), so "
            "the deterministic region would miss PyTorch's allocations. The plugin puts it in LD_PRELOAD in SGLang's "
            "main process before the schedulers are spawned: check that sglang-foundry is installed where the main "
            "process finds it (its 'sglang.srt.plugins' entry point) and that nothing clears LD_PRELOAD, or start with "
            f"`foundry run -- python -m sglang.launch_server ...`. Or {modes.OFF_HINT}.")


def scheduler_rank(kwargs: Mapping[str, Any]) -> int:
    """This scheduler's global rank: ``tp_size * pp_rank + tp_rank`` as SGLang computes it (0.5.17
    passes the ranks to ``_init_parallel_groups``; 0.5.23 reads them from its parallel context)."""
    if "tp_rank" in kwargs:
        return int(kwargs.get("tp_size") or 1) * int(kwargs.get("pp_rank") or 0) + int(kwargs["tp_rank"])
    try:
        from sglang.srt.runtime_context import get_parallel  # type: ignore[import-not-found]

        parallel = get_parallel()
        return int(parallel.tp_size) * int(parallel.pp_rank) + int(parallel.tp_rank)
    except Exception:  # noqa: BLE001 - one GPU (modes.py refuses more): rank 0
        return 0


def wrap_parallel_groups(original: Callable[..., Any]) -> Callable[..., Any]:
    def _init_parallel_groups(*args: Any, **kwargs: Any) -> Any:
        if runtime.current() is not None or resolve_settings().mode is Mode.OFF:
            return original(*args, **kwargs)  # a later bring-up (elastic EP) is not ours to track
        server_args = kwargs.get("server_args")
        check_scheduler_process(server_args)
        rt = runtime.start(server_args, scheduler_rank(kwargs), kwargs.get("model_config"))
        if rt is None:
            return original(*args, **kwargs)
        use_nccl_all_reduce(server_args)
        jit_caches.begin(rt)  # LOAD: the archive's JIT caches placed on a thread while SGLang loads the model
        if rt.mode is Mode.LOAD:
            warm_triton_key()  # while SGLang loads the model; LOAD skips the warmup that computed it
        with runtime.timed("NCCL bring-up (before the determinism boundary)"):
            result = original(*args, **kwargs)
        rt.boundary()
        return result

    return _init_parallel_groups


def use_nccl_all_reduce(server_args: Any) -> None:
    """With tensor parallel, every all-reduce through NCCL, whose calls a LOAD makes again
    (docs/multi-gpu.md): SGLang's custom all-reduce off before the groups are made (it bakes the
    peers' symmetric-memory addresses into the graphs), and the logits' multimem all-gather
    answering NCCL's all-gather. The other paths are refused in modes.py."""
    if int(modes.setting(server_args, "tp_size", 1)) <= 1:
        return
    patching.resolve("parallel.custom_all_reduce")(False)
    patching.install("comm.multimem_gather", lambda original: _no_multimem_state)
    logger.info("foundry: custom all-reduce off (tensor parallel all-reduces through NCCL)")


def _no_multimem_state(self: Any, x: Any) -> None:
    """``MultimemAllGatherer._build`` answering None: that gatherer then uses NCCL's all-gather."""
    return None


# ---- 2. KV sizing --------------------------------------------------------------------------------


def pool_config_fields(config: Any) -> dict[str, Any]:
    """The fields of a MemoryPoolConfig (a dataclass of ints, floats and None) as JSON values."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise StateError(f"sglang-foundry: _resolve_memory_pool_config returned a {type(config).__name__}, expected "
                         f"the MemoryPoolConfig dataclass (SGLang {patching.sglang_version()}). {modes.OFF_HINT}")
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is not None and not isinstance(value, (int, float, str, bool)):
            raise StateError(f"sglang-foundry: MemoryPoolConfig.{f.name} is a {type(value).__name__}, which the "
                             f"archive cannot record. {modes.OFF_HINT}")
        out[f.name] = value
    return out


def build_pool_config(fields: Mapping[str, Any]) -> Any:
    """A MemoryPoolConfig from recorded fields; MismatchError when this SGLang's class differs."""
    from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig  # type: ignore[import-not-found]

    try:
        return MemoryPoolConfig(**dict(fields))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise MismatchError(f"the recorded MemoryPoolConfig {dict(fields)} does not fit this SGLang's ({exc})") \
            from None


def _recorded_pool_config(rt: runtime.SchedulerRuntime) -> tuple[Any, Any]:
    """(recorded fields, rebuilt MemoryPoolConfig) for LOAD; MismatchError when unusable."""
    state = rt.session.recorded_state()
    assert state is not None
    fields = state.adapter.get(POOL_CONFIG_KEY) if isinstance(state.adapter, Mapping) else None
    if not isinstance(fields, Mapping):
        raise MismatchError("the archive's engine state records no MemoryPoolConfig")
    free = rt.device.free_memory()
    if free < state.kv_cache_bytes:
        raise MismatchError(f"the GPU has {free / GIB:.2f} GiB free, the archive's KV cache needs "
                            f"{state.kv_cache_bytes / GIB:.2f} GiB")
    return fields, build_pool_config(fields)


def _agreed_pool_config(rt: runtime.SchedulerRuntime) -> Any:
    """LOAD's first agreement (ranks.py): the MemoryPoolConfig SAVE recorded when every rank LOADs
    and can use its record (SGLang's profiling, with its all-reduce, is skipped), else None (this
    rank profiles, after falling back if it was loading)."""
    fields: Mapping[str, Any] = {}
    config = problem = None
    with ranks.Agreement(rt) as agreement:  # answered (no) also when an error leaves the block
        if ranks.loading(rt):
            try:
                fields, config = _recorded_pool_config(rt)
            except MismatchError as exc:
                problem = exc
        agreed = ranks.agree(rt, problem is None, "at the KV pool", agreement)
    if not agreed:
        if problem is not None and rt.mode is Mode.LOAD:
            rt.fall_back(problem)
        return None
    warm_triton_key()  # if Triton was not imported yet at the NCCL seam
    rt.skipped("KV-cache memory profiling")
    rt.adapter.state[POOL_CONFIG_KEY] = dict(fields)
    logger.info("foundry: KV pool of %s tokens, as recorded at SAVE (no memory profiling)",
                fields.get("max_total_num_tokens"))
    return config


def wrap_resolve_memory_pool_config(original: Callable[..., Any]) -> Callable[..., Any]:
    def _resolve_memory_pool_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None or getattr(self, "is_draft_worker", False):
            return original(self, *args, **kwargs)
        if rt.region_open and getattr(self, "mambaish_config", None) is not None:
            # Its sizing path overrides runtime-context values (max Mamba cache) that LOAD would skip.
            raise modes.refuse("hybrid Mamba / linear-attention models are not supported")
        if ranks.may_load(rt):
            recorded = _agreed_pool_config(rt)
            if recorded is not None:
                return recorded
        if not rt.region_open:  # Foundry off here, or a LOAD that fell back: SGLang alone from here
            return original(self, *args, **kwargs)
        with runtime.timed("KV-cache memory profiling"), rt.paused():
            config = original(self, *args, **kwargs)
        rt.adapter.state[POOL_CONFIG_KEY] = pool_config_fields(config)
        return config

    return _resolve_memory_pool_config


# ---- 3. KV pools ---------------------------------------------------------------------------------


def kv_cache_bytes(pool: Any) -> int:
    """The bytes of SGLang's KV pool (``get_kv_size_bytes()``: an int or a (K, V) pair), 0 when the
    pool does not say."""
    size = getattr(pool, "get_kv_size_bytes", None)
    if callable(size):
        try:
            value = size()
        except Exception:  # noqa: BLE001 - a pool without buffers of its own: not reported
            value = None
        if isinstance(value, (tuple, list)):
            return int(sum(int(v) for v in value))
        if isinstance(value, int):
            return value
    usage = getattr(pool, "mem_usage", None)  # GB, as SGLang logs it
    return int(usage * GIB) if isinstance(usage, (int, float)) else 0


def wrap_alloc_memory_pool(original: Callable[..., Any]) -> Callable[..., Any]:
    def alloc_memory_pool(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        rt = runtime.current()
        if rt is None or not rt.region_open or getattr(self, "is_draft_worker", False):
            return result
        tokens = int(self.max_total_num_tokens)
        kv_bytes = kv_cache_bytes(getattr(self, "token_to_kv_pool", None))
        if rt.mode is Mode.LOAD:
            state = rt.session.recorded_state()
            assert state is not None
            if (tokens, kv_bytes) != (state.kv_cache_blocks, state.kv_cache_bytes):
                rt.fall_back(MismatchError(
                    f"SGLang allocated a KV pool of {tokens} tokens ({kv_bytes} bytes); the archive was saved with "
                    f"{state.kv_cache_blocks} tokens ({state.kv_cache_bytes} bytes)"))
        rt.adapter.state.update(kv_cache_blocks=tokens, kv_cache_bytes=kv_bytes,
                                max_running_requests=int(getattr(self, "max_running_requests", 0) or 0))
        logger.info("foundry: KV pool of %d tokens, %.2f GiB", tokens, kv_bytes / GIB)
        return result

    return alloc_memory_pool


# ---- 4. kernel warmup ----------------------------------------------------------------------------


def wrap_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    def warmup(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        model_runner = getattr(self, "model_runner", None)
        if rt is None or not rt.region_open or getattr(model_runner, "_kernel_warmed_up", False):
            return original(self, *args, **kwargs)  # SGLang's own once-per-process flag: a no-op
        if rt.mode is Mode.LOAD:
            # Set SGLang's flag as the SAVE warmup did, so its second call (in the decode capture) is
            # a no-op on both sides instead of a second pause on this one.
            if model_runner is not None:
                model_runner._kernel_warmed_up = True
            rt.skipped("the kernel warmup (FlashInfer workspaces and autotune, DeepGEMM)")
            return None
        with runtime.timed("kernel warmup"), rt.paused():
            return original(self, *args, **kwargs)

    return warmup


# ---- 5. post-capture KV resize ---------------------------------------------------------------------


def wrap_post_capture_resize(original: Callable[..., Any]) -> Callable[..., Any]:
    def post_capture_resize_kv_pool(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is not None and rt.active:
            raise modes.refuse("post-capture KV resizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING) changes the KV pool "
                               "the captured graphs read")
        return original(self, *args, **kwargs)

    return post_capture_resize_kv_pool


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "worker.parallel_groups": wrap_parallel_groups,
    "kv.resolve": wrap_resolve_memory_pool_config,
    "runner.alloc_memory_pool": wrap_alloc_memory_pool,
    "warmup.runner": wrap_warmup,
    "runner.post_capture_resize": wrap_post_capture_resize,
}


def install() -> None:
    """Wraps every worker seam; SeamError names the first one missing in the installed SGLang."""
    for name, make in WRAPPERS.items():
        patching.install(name, make)
