"""The Foundry state of one vLLM worker process: its EngineSession, its adapter, the startup
phase it is in, and the region pauses SAVE uses for work LOAD does not repeat.

vLLM runs one GPU worker per process (UniProcExecutor inside EngineCore, or one MultiprocExecutor
worker per rank), so the state is process-global: ``start()`` creates it at the first seam
(``init_worker_distributed_environment``), ``current()`` returns it to the later seams.

Phases: INIT (device, NCCL, weights, memory, KV cache) -> WARMUP (inside
``Worker.compile_or_warm_up_model``) -> CAPTURE (inside ``GPUModelRunner.capture_model``) ->
WARMUP -> SERVING. The region is open from ``session.begin()`` until the capture phase ends.

**Pauses.** SAVE runs the work LOAD skips (memory profiling, compile warmup, kernel warmup)
*paused*, outside the region; LOAD makes the same cache flushes with nothing in between. The pause
machinery, ``timed`` and the life cycle (begin, boundary, fall_back, finish) are engine-agnostic:
:mod:`foundry_core.engine.worker`; this module adds vLLM's phases, names and variables.
"""

from __future__ import annotations

import enum
import functools
import logging
from typing import Any, ClassVar

from foundry_core.engine import EngineSession, Mode
from foundry_core.engine import options, worker
from foundry_core.engine.host_caches import CacheTree
from foundry_core.errors import InvalidArgumentError

from vllm_foundry import compile_cache, compile_key, patching
from vllm_foundry.adapter import VllmAdapter
from vllm_foundry.modes import instantiate_mode

logger = logging.getLogger("foundry.vllm")

JIT_WARMUP_ENV = "FOUNDRY_VLLM_JIT_WARMUP"            # 1 (default): LOAD runs vLLM's V2 JIT warmup; 0: skips it
CHECK_METADATA_ENV = "FOUNDRY_VLLM_CHECK_METADATA"    # 1 (default): compare attention-metadata addresses
# 1: LOAD runs vLLM's compile-warmup forwards and kernel warmup outside the region, as SAVE does,
# instead of skipping them (a diagnosis: LOAD's process then has run what SAVE's has); 0 (default).
LOAD_WARMUPS_ENV = "FOUNDRY_VLLM_LOAD_WARMUPS"

# A boolean variable: unset or empty gives the default (True); 0/false/no/off give False.
env_flag = options.env_flag
# Logs how long the body took on this plugin's logger: one line per startup step.
timed = functools.partial(worker.timed, log=logger)


class Phase(enum.Enum):
    INIT = "init"
    WARMUP = "warmup"
    CAPTURE = "capture"
    SERVING = "serving"


class DeviceOps(worker.DeviceOps):
    """The device operations the runtime needs (torch and libfoundry.so); a fake in unit tests."""

    logger: ClassVar[logging.Logger] = logger


class WorkerRuntime(worker.WorkerRuntime):
    """One vLLM worker's Foundry state; see the module docstring and
    :class:`foundry_core.engine.worker.WorkerRuntime`."""

    logger: ClassVar[logging.Logger] = logger
    no_capture_warning: ClassVar[str] = "vLLM captured no CUDA graphs (capture seam not reached)"
    carries_host_caches: ClassVar[bool] = True
    # Joined before vLLM's first forward (worker_patches.py), which is where it first reads its
    # compile cache: the copy overlaps the model load and the KV cache's allocation.
    places_caches_ahead: ClassVar[bool] = True

    def __init__(self, session: EngineSession, adapter: VllmAdapter, device: DeviceOps | None = None) -> None:
        super().__init__(session, adapter, device if device is not None else DeviceOps())
        self.phase = Phase.INIT
        self.worker: Any = None
        self.runner: Any = None
        self.pieces: Any = None  # LOAD, piecewise: the restored pieces (piecewise.Pieces)

    def host_cache_trees(self) -> list[CacheTree]:
        """vLLM's torch.compile cache (compile_cache.py); Triton's is carried by the core."""
        try:
            model = getattr(getattr(self.worker, "model_runner", None), "model", None)
            return [compile_cache.tree(self.adapter.config, model=model)]
        except ImportError as exc:  # vllm.envs: only outside a vLLM process
            logger.debug("foundry: vLLM's compile cache not carried (%s)", exc)
            return []

    def carry_caches_in(self) -> None:
        """The core's carrying, then the host paths in vLLM's compile-cache key (compile_key.py),
        before vLLM computes the key at its first forward: SAVE's in the key at a LOAD whose
        archive carries vLLM's compiled model, and recorded as the key hashed them (a LOAD that
        falls back saves with them)."""
        super().carry_caches_in()
        if not self.active:
            return
        try:
            import vllm.envs as envs
        except ImportError:  # only outside a vLLM process
            return
        differ: dict[str, tuple[str, str]] = {}
        aot = f"{compile_cache.COMPILE_DIR}/{compile_cache.AOT_DIR}"  # the compiled model, not only model infos
        if self.mode is Mode.LOAD and self.carried_in is not None and self.carried_in.paths(compile_cache.CACHE, aot):
            differ = compile_key.match(self.recorded_adapter_state(), envs)
        if differ:
            # One worker per process: the wrapper is installed once, with this runtime's values.
            try:
                patching.install("compile.key_env_factors", compile_key.keyed_as_at_save(differ))
            except patching.SeamError:
                compile_key.say_compiles(differ, "vLLM's envs.compile_factors could not be wrapped")
                differ = {}
            else:
                compile_key.say_keyed(differ)
        compile_key.record(self.adapter.state, envs, differ)

    def lazy_instantiation(self) -> bool:
        try:
            return instantiate_mode()[0] == "lazy"
        except InvalidArgumentError:
            return False  # the restore reports the setting


_SLOT: worker.RuntimeSlot[WorkerRuntime] = worker.RuntimeSlot()


def current() -> WorkerRuntime | None:
    """This process's worker runtime, or None (Foundry off, or no worker started yet)."""
    return _SLOT.runtime


def start(vllm_config: Any, rank: int, *, device: DeviceOps | None = None,
          adapter: VllmAdapter | None = None) -> WorkerRuntime | None:
    """Creates this process's runtime from FOUNDRY_ARCHIVE / FOUNDRY_MODE and begins the session
    (sets the region). Returns None when Foundry is off."""
    return _SLOT.keep(worker.start_runtime(rank, lambda: adapter if adapter is not None else VllmAdapter(vllm_config),
                              functools.partial(WorkerRuntime, device=device), session_factory=EngineSession))


def reset() -> None:
    """Forgets this process's runtime (tests)."""
    _SLOT.reset()


__all__ = ["Phase", "WorkerRuntime", "DeviceOps", "current", "start", "reset", "env_flag", "timed"]
