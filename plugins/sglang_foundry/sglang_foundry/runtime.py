"""The Foundry state of one SGLang scheduler process: its EngineSession, its adapter, the startup
phase it is in, and the region pauses SAVE uses for work LOAD does not repeat.

SGLang runs one scheduler (with one target model runner) per process, so the state is
process-global: ``start()`` creates it at the NCCL seam (``bootstrap._init_parallel_groups``),
``current()`` returns it to the later seams.

Phases: INIT (NCCL, weights, KV sizing and pools, attention backends) -> CAPTURE (inside
``ModelRunner.init_cuda_graphs``: eager runner and its kernel warmup, decode capture) -> SERVING.
The region is open from ``session.begin()`` until the capture phase ends.

**Pauses.** SAVE runs the work LOAD skips (KV profiling, the kernel warmup, the capture warmup
forwards) *paused*, outside the region; LOAD makes the same cache flushes with nothing in between
(``skipped``). The pause machinery, ``timed`` and the life cycle (begin, boundary, fall_back,
finish) are engine-agnostic: :mod:`foundry_core.engine.worker`; this module adds SGLang's phases
and names.
"""

from __future__ import annotations

import enum
import functools
import logging
from typing import Any, ClassVar

from foundry_core.engine import EngineSession, NativeRegionRuntime, RegionRuntime, worker
from foundry_core.errors import InvalidArgumentError

from sglang_foundry import options
from sglang_foundry.adapter import SglangAdapter

logger = logging.getLogger("foundry.sglang")

# Logs how long the body took on this plugin's logger: one line per startup step.
timed = functools.partial(worker.timed, log=logger)


class Phase(enum.Enum):
    INIT = "init"
    CAPTURE = "capture"
    SERVING = "serving"


class DeviceOps(worker.DeviceOps):
    """The device operations the runtime needs (torch and libfoundry.so); a fake in unit tests."""

    logger: ClassVar[logging.Logger] = logger


def region_runtime() -> RegionRuntime:
    """The region operations of new sessions (libfoundry.so; the unit tests replace it)."""
    return NativeRegionRuntime()


class SchedulerRuntime(worker.WorkerRuntime):
    """One scheduler's Foundry state; see the module docstring and
    :class:`foundry_core.engine.worker.WorkerRuntime`. A session that fell back to OFF at the
    determinism boundary ends the region there; "LOAD skips ..." lines are debug lines."""

    logger: ClassVar[logging.Logger] = logger
    skip_level: ClassVar[int] = logging.DEBUG
    no_capture_warning: ClassVar[str] = "SGLang captured no decode CUDA graphs (capture seam not reached)"
    end_when_off_at_boundary: ClassVar[bool] = True

    def __init__(self, session: EngineSession, adapter: SglangAdapter, device: DeviceOps | None = None) -> None:
        super().__init__(session, adapter, device if device is not None else DeviceOps())
        self.phase = Phase.INIT
        self.runner: Any = None            # the target ModelRunner, during the capture phase
        self.loop: Any = None              # the decode capture loop the capture seams drive (CaptureLoop)
        self.restored = 0

    def lazy_instantiation(self) -> bool:
        try:
            return options.instantiate_mode()[0] == "lazy"
        except InvalidArgumentError:
            return False  # the restore reports the setting


_SLOT: worker.RuntimeSlot[SchedulerRuntime] = worker.RuntimeSlot()


def current() -> SchedulerRuntime | None:
    """This process's scheduler runtime, or None (Foundry off, or no scheduler started yet)."""
    return _SLOT.runtime


def start(server_args: Any, rank: int, model_config: Any = None, *, device: DeviceOps | None = None,
          adapter: SglangAdapter | None = None) -> SchedulerRuntime | None:
    """Creates this process's runtime from FOUNDRY_ARCHIVE / FOUNDRY_MODE and begins the session
    (sets the region). Returns None when Foundry is off."""
    return _SLOT.keep(worker.start_runtime(
        rank, lambda: adapter if adapter is not None else SglangAdapter(server_args, model_config),
        functools.partial(SchedulerRuntime, device=device), session_factory=EngineSession, region=region_runtime))


def reset() -> None:
    """Forgets this process's runtime (tests)."""
    _SLOT.reset()


__all__ = ["Phase", "SchedulerRuntime", "DeviceOps", "current", "start", "reset", "timed", "region_runtime"]
