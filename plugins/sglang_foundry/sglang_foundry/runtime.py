"""The Foundry state of one SGLang scheduler process: its EngineSession, its adapter, the startup
phase it is in, and the region pauses SAVE uses for work LOAD does not repeat.

SGLang runs one scheduler (with one target model runner) per process, so the state is
process-global: ``start()`` creates it at the NCCL seam (``bootstrap._init_parallel_groups``),
``current()`` returns it to the later seams.

Phases: INIT (NCCL, weights, KV sizing and pools, attention backends) -> CAPTURE (inside
``ModelRunner.init_cuda_graphs``: eager runner and its kernel warmup, decode capture) -> SERVING.
The region is open from ``session.begin()`` until the capture phase ends.

**Pauses.** Allocations after the determinism boundary must be the same on SAVE and LOAD, but
SAVE runs work LOAD skips (KV profiling, the kernel warmup, the capture warmup forwards). SAVE
runs it *paused*: the region stopped (new allocations take the driver's normal path) and PyTorch
allocating into a private memory pool, so neither the region nor the default pool's cache keeps a
trace of it. Both sides empty PyTorch's cache where a pause starts and ends, LOAD with nothing in
between (``skipped``), so the region sees the same frees in the same places.

The pause machinery is the vLLM plugin's (``vllm_foundry.runtime``) with SGLang's names; it is
engine-agnostic and belongs in ``foundry_core.engine`` (see the plugin README).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections.abc import Iterator
from typing import Any

from foundry_core.engine import EngineSession, Mode, NativeRegionRuntime, RegionRuntime, get_plugin_manager
from foundry_core.engine import resolve_settings
from foundry_core.errors import FoundryError

from sglang_foundry.adapter import SglangAdapter

logger = logging.getLogger("foundry.sglang")


class Phase(enum.Enum):
    INIT = "init"
    CAPTURE = "capture"
    SERVING = "serving"


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    """Logs how long the body took: one line per startup step, so the start can be accounted for
    from the log."""
    start = time.perf_counter()
    try:
        yield
    finally:
        logger.info("foundry: %s took %.2f s", what, time.perf_counter() - start)


class DeviceOps:
    """The device operations the runtime needs (torch and libfoundry.so); a fake in unit tests."""

    def empty_cache(self) -> None:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def free_memory(self) -> int:
        import torch

        return int(torch.cuda.mem_get_info()[0])

    def stop_region(self) -> None:
        from foundry_core.region import stop_allocation_region

        stop_allocation_region()

    def resume_region(self) -> None:
        from foundry_core.region import resume_allocation_region

        resume_allocation_region()

    def private_pool(self) -> Any:
        """A torch MemPool for paused work, or None when this torch has none."""
        import torch

        pool_cls = getattr(torch.cuda, "MemPool", None)
        if pool_cls is None or not hasattr(torch.cuda, "use_mem_pool"):
            logger.warning("foundry: this torch has no torch.cuda.MemPool; paused SAVE work shares PyTorch's default "
                           "pool (the archive may then fail its pointer audit)")
            return None
        return pool_cls()

    def use_pool(self, pool: Any) -> contextlib.AbstractContextManager[Any]:
        if pool is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.use_mem_pool(pool)


def region_runtime() -> RegionRuntime:
    """The region operations of new sessions (libfoundry.so; the unit tests replace it)."""
    return NativeRegionRuntime()


class SchedulerRuntime:
    """One scheduler's Foundry state; see the module docstring."""

    def __init__(self, session: EngineSession, adapter: SglangAdapter, device: DeviceOps | None = None) -> None:
        self.session = session
        self.adapter = adapter
        self.device = device if device is not None else DeviceOps()
        self.phase = Phase.INIT
        self.runner: Any = None            # the target ModelRunner, during the capture phase
        self.loop: Any = None              # the decode capture loop the capture seams drive (CaptureLoop)
        self.archive: Any = None           # the restored GraphArchive, kept alive with its outputs
        self.capture_seen = False
        self.saved = False
        self.restored = 0
        self._ended = False
        self._pause_depth = 0
        self._pool: Any = None

    @property
    def mode(self) -> Mode:
        return self.session.mode

    @property
    def active(self) -> bool:
        """SAVE or LOAD (a fallback may have turned the session OFF)."""
        return self.session.mode in (Mode.SAVE, Mode.LOAD)

    @property
    def region_open(self) -> bool:
        """The region is set and not yet ended: allocations land in it."""
        return self.active and not self._ended

    def begin(self) -> None:
        self.session.begin()

    def boundary(self) -> None:
        self.session.determinism_boundary()
        if not self.active:
            self._ended = True

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Runs the body outside the region (see the module docstring). Nested pauses and pauses
        while the region is closed do nothing special."""
        if self._pause_depth or not self.region_open:
            self._pause_depth += 1
            try:
                yield
            finally:
                self._pause_depth -= 1
            return
        self._pause_depth += 1
        self.device.empty_cache()
        self.device.stop_region()
        try:
            if self._pool is None:
                self._pool = self.device.private_pool()
            with self.device.use_pool(self._pool):
                yield
        finally:
            try:
                self.device.empty_cache()
            finally:
                self.device.resume_region()
                self._pause_depth -= 1

    def skipped(self, what: str) -> None:
        """LOAD's stand-in for paused SAVE work: the same cache flushes, nothing in between."""
        with self.paused():
            pass
        logger.debug("foundry: LOAD skips %s", what)

    def fall_back(self, cause: FoundryError) -> Mode:
        """Applies the session's fallback policy to ``cause`` (logs it, calls foundry_on_fallback,
        mode becomes SAVE or OFF, raises with FOUNDRY_FALLBACK=0), then drops the restored graphs;
        returns the new mode."""
        mode = self.session.fall_back(cause)
        if mode is Mode.OFF:
            self._ended = True
        if self.archive is not None:
            self.archive.close()
            self.archive = None
        return mode

    def finish(self) -> None:
        """Ends the region after the capture phase (both sides); later allocations take the
        normal path. Warns when the decode capture seam was never reached."""
        if self._ended:
            return
        self._ended = True
        if self.active and not self.capture_seen:
            logger.warning("foundry: SGLang captured no decode CUDA graphs (capture seam not reached); %s",
                           "no archive was written" if self.mode is Mode.SAVE else "no graph was restored")
        self.session.end()


_current: SchedulerRuntime | None = None


def current() -> SchedulerRuntime | None:
    """This process's scheduler runtime, or None (Foundry off, or no scheduler started yet)."""
    return _current


def start(server_args: Any, rank: int, model_config: Any = None, *, device: DeviceOps | None = None,
          adapter: SglangAdapter | None = None) -> SchedulerRuntime | None:
    """Creates this process's runtime from FOUNDRY_ARCHIVE / FOUNDRY_MODE and begins the session
    (sets the region). Returns None when Foundry is off."""
    global _current
    settings = resolve_settings()
    if settings.mode is Mode.OFF:
        return None
    adapter = adapter if adapter is not None else SglangAdapter(server_args, model_config)
    session = EngineSession(settings.archive, settings.mode, rank, get_plugin_manager(adapter),
                            runtime=region_runtime())
    rt = SchedulerRuntime(session, adapter, device if device is not None else DeviceOps())
    logger.info("foundry: rank %d runs in mode %s with archive %s", rank, session.mode, settings.archive)
    rt.begin()
    _current = rt
    return rt


def reset() -> None:
    """Forgets this process's runtime (tests)."""
    global _current
    _current = None


__all__ = ["Phase", "SchedulerRuntime", "DeviceOps", "current", "start", "reset", "timed", "region_runtime"]
