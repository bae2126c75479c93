"""The worker-side runtime of an engine plugin: one process's Foundry state during start-up.

An engine plugin wraps the engine's start-up seams; in the process that runs a model (a vLLM
worker, an SGLang scheduler) they share one :class:`WorkerRuntime`: the rank's
:class:`~foundry_core.engine.session.EngineSession`, the plugin's engine adapter, and the device
operations the region pauses need. A plugin subclasses :class:`WorkerRuntime` to add its phases
and the engine objects its seams hand to each other, and sets the class attributes that name it
in the log (``logger``, ``no_capture_warning``).

Life cycle (the plugin's seams call these): :meth:`WorkerRuntime.begin` (region set, before
NCCL) -> :meth:`~WorkerRuntime.boundary` (determinism boundary, after NCCL; LOAD starts handing the
kernel images to the driver on a thread, :mod:`~foundry_core.engine.images_ahead`) -> work SAVE and LOAD
do alike, and work only SAVE does, run :meth:`~WorkerRuntime.paused` (SAVE) or
:meth:`~WorkerRuntime.skipped` (LOAD) -> capture or restore -> :meth:`~WorkerRuntime.finish`
(region ended). :meth:`~WorkerRuntime.fall_back` applies the session's fallback policy at any
point. When the outermost start-up phase ends (the restore or the capture, and what the plugin's
phase holds around it), the process's critical-path line is logged
(:mod:`foundry_core.engine.critical_path`).

**Pauses.** Allocations after the determinism boundary must be the same on SAVE and LOAD, but SAVE
runs work LOAD skips (memory profiling, compile and kernel warmups). SAVE runs it *paused*: the
region stopped (new allocations take the driver's normal path) and PyTorch allocating into a
private memory pool of that pause, so neither the region nor the default pool's cache keeps a
trace of it; the pool is let go when the pause ends, which returns its cached blocks (a memory
profile's peak activations) to the device, while tensors still alive in it keep theirs. Both
sides empty PyTorch's cache where a pause starts and ends, LOAD with nothing in between
(:meth:`~WorkerRuntime.skipped`), so the region sees the same frees in the same places.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from foundry_core.engine import cache_carry, critical_path, host_caches, options, triton_cache
from foundry_core.engine.host_caches import CacheTree, Copied, HostCaches
from foundry_core.engine.images_ahead import EXEC_WARMUP_ENV, IMAGES_AHEAD_ENV
from foundry_core.engine.mode import Mode, resolve_settings
from foundry_core.engine.plugin_manager import get_plugin_manager
from foundry_core.engine.session import EngineSession, RegionRuntime
from foundry_core.errors import FoundryError, StateError

logger = logging.getLogger("foundry")

__all__ = ["DeviceOps", "WorkerRuntime", "RuntimeSlot", "start_runtime", "timed"]

_R = TypeVar("_R", bound="WorkerRuntime")
_A = TypeVar("_A")


@contextlib.contextmanager
def timed(what: str, log: logging.Logger | None = None) -> Iterator[None]:
    """Logs how long the body took (``foundry: <what> took 1.23 s``, at INFO on ``log``, default
    the ``foundry`` logger), even when it raises: one line per start-up step, so every second from
    process start to ready can be accounted for from the log."""
    start = time.perf_counter()
    try:
        yield
    finally:
        (log or logger).info("foundry: %s took %.2f s", what, time.perf_counter() - start)


# A pause that gave back at least this much says so at INFO (a memory profile's activations).
RETURNED_LOG_BYTES = 256 << 20


class DeviceOps:
    """The device operations a :class:`WorkerRuntime` needs (torch and libfoundry.so), imported
    only when called. Unit tests pass a subclass that records the calls instead; a plugin sets
    ``logger`` to its own logger in a subclass."""

    logger: ClassVar[logging.Logger] = logger
    _warned_no_pool = False

    def empty_cache(self) -> None:
        """Waits for the device, then returns PyTorch's cached free blocks to the driver."""
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def free_memory(self) -> int:
        """Free device memory in bytes, as the driver reports it."""
        import torch

        return int(torch.cuda.mem_get_info()[0])

    def stop_region(self) -> None:
        """New allocations take the driver's normal path until :meth:`resume_region`."""
        from foundry_core.region import stop_allocation_region

        stop_allocation_region()

    def resume_region(self) -> None:
        """New allocations land in the deterministic region again."""
        from foundry_core.region import resume_allocation_region

        resume_allocation_region()

    def private_pool(self) -> Any:
        """A new torch MemPool for paused work, or None (with a warning, once) when this torch has
        none. PyTorch releases a MemPool when its last reference goes: its cached blocks return to
        the device then, or at a later cache flush for blocks still in use."""
        import torch

        pool_cls = getattr(torch.cuda, "MemPool", None)
        if pool_cls is None or not hasattr(torch.cuda, "use_mem_pool"):
            if not self._warned_no_pool:
                self._warned_no_pool = True
                self.logger.warning("foundry: this torch has no torch.cuda.MemPool; paused SAVE work shares "
                                    "PyTorch's default pool (the archive may then fail its pointer audit)")
            return None
        return pool_cls()

    def thread_binder(self) -> Callable[[], None]:
        """A function that makes this thread's current CUDA context current on the thread that
        calls it (a new thread starts with none). The context itself, not a device index:
        ``torch.cuda.set_device(0)`` on a new thread makes no call at all (the thread already
        reports device 0). StateError when this thread has no current context."""
        import ctypes

        cuda = ctypes.CDLL("libcuda.so.1")
        ctx = ctypes.c_void_p()
        result = cuda.cuCtxGetCurrent(ctypes.byref(ctx))
        if result != 0 or not ctx.value:
            raise StateError(f"no current CUDA context to hand to another thread (cuCtxGetCurrent: {result})")

        def bind() -> None:
            status = cuda.cuCtxSetCurrent(ctx)
            if status != 0:
                raise StateError(f"cuCtxSetCurrent failed: CUresult {status}")

        return bind

    def use_pool(self, pool: Any) -> contextlib.AbstractContextManager[Any]:
        """PyTorch allocates from ``pool`` inside the block (nothing changes when ``pool`` is None)."""
        if pool is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.use_mem_pool(pool)


class WorkerRuntime:
    """One model-running process's Foundry state; see the module docstring.

    Subclasses set (class attributes):

    - ``logger``: the plugin's logger (``foundry.<engine>``);
    - ``skip_level``: the level of the "LOAD skips ..." lines (default INFO);
    - ``no_capture_warning``: what :meth:`finish` warns when the capture seam was never reached
      (the engine name, which graphs);
    - ``end_when_off_at_boundary``: True when a session that fell back to OFF at the determinism
      boundary ends the region there (then :meth:`finish` does not end the session again);
    - ``carries_host_caches``: True when the plugin calls :meth:`carry_caches_out` after the
      engine's warmup (then Triton's cache, and :meth:`host_cache_trees`, travel in the archive);
    - ``places_caches_ahead``: True when the plugin calls :meth:`wait_caches` before the engine
      first reads its compile caches (then LOAD places them on a thread, beside the model load).

    Attributes the seams read and set: ``phase`` (the plugin's start-up phase, see
    :meth:`in_phase`), ``archive`` (the restored GraphArchive, kept alive with its outputs and
    closed on a fallback), ``capture_seen``, ``saved``.
    """

    logger: ClassVar[logging.Logger] = logger
    skip_level: ClassVar[int] = logging.INFO
    no_capture_warning: ClassVar[str] = "the engine captured no CUDA graphs (capture seam not reached)"
    end_when_off_at_boundary: ClassVar[bool] = False
    carries_host_caches: ClassVar[bool] = False
    places_caches_ahead: ClassVar[bool] = False

    def __init__(self, session: EngineSession, adapter: Any, device: DeviceOps | None = None) -> None:
        self.session = session
        self.adapter = adapter
        self.device = device if device is not None else DeviceOps()
        self.phase: Any = None
        self.archive: Any = None
        self.capture_seen = False
        self.saved = False
        self._ended = False
        self.carried_in: HostCaches | None = None  # LOAD: the archive's carried caches, once read
        self._ahead: cache_carry.CachesAhead | None = None  # LOAD: placing them, until wait_caches()
        self._pause_depth = 0
        self._phase_depth = 0
        self.ledger = critical_path.LEDGER
        self.triton: triton_cache.TritonCarrier | None = None

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
        """Begins the session: sets the region (before NCCL)."""
        self.session.begin()

    def launch(self: _R, rank: int, archive: Any) -> _R:
        """Logs the rank's mode and archive, then :meth:`begin`; returns this runtime (a plugin's
        ``start()`` ends with it)."""
        self.logger.info("foundry: rank %d runs in mode %s with archive %s", rank, self.session.mode, archive)
        self.begin()
        self.carry_caches_in()
        return self

    # ---- host caches (foundry_core.engine.host_caches) ---------------------------------------------

    def host_cache_trees(self) -> list[CacheTree]:
        """The engine's compile caches carried in the archive besides Triton's (a plugin answers;
        ``used`` matters at SAVE, after the warmup)."""
        return []

    def carry_caches_in(self) -> None:
        """SAVE and LOAD: Triton's cache opens its entries through a carrier; LOAD also puts the
        archive's carried files the host lacks into the engine's caches, before the engine looks:
        here, or on a thread that :meth:`wait_caches` joins (``places_caches_ahead``)."""
        if not self.carries_host_caches or not self.active or not host_caches.enabled():
            return
        where = self._archive_dirs()
        if where is None:
            return
        source, carrier = cache_carry.carry_in(*where, load=self.mode is Mode.LOAD)
        self.carried_in = source
        if carrier is not None:
            self.triton = carrier
        if source is None:
            return
        if self.places_caches_ahead:
            self._ahead = cache_carry.CachesAhead(source, self.host_cache_trees(), self.logger,
                                                  triton=self.triton).start()
            return
        start = time.perf_counter()
        done = Copied()
        for tree in self.host_cache_trees():
            try:
                done.add(source.restore(tree))
            except OSError as exc:
                self.logger.warning("foundry: %s not taken from the archive (%s); the engine compiles", tree.cache, exc)
        if done.files or done.refused:
            self.logger.info("foundry: compile caches from the archive: %s in %.2f s", done.describe(),
                             time.perf_counter() - start)

    def wait_caches(self) -> None:
        """LOAD with ``places_caches_ahead``: waits until the archive's caches are placed (once;
        nothing otherwise). The wait counts on the critical path as ``host caches``."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.wait()

    def carry_caches_out(self) -> None:
        """SAVE, after the engine's warmup: carries the caches this start used into the archive
        (Triton's entries looked up, the engine's trees). A failure is logged; the graphs stay."""
        if not self.carries_host_caches or self.mode is not Mode.SAVE or not self.saved or not host_caches.enabled():
            return
        where = self._archive_dirs()
        if where is None:
            return
        cache_carry.CacheCarry(HostCaches(*where), self.triton, self.host_cache_trees, self.logger).carry()

    def _archive_dirs(self) -> tuple[Path, Path] | None:
        archive, rank_dir = self.session.archive, self.session.rank_dir
        return None if archive is None or rank_dir is None else (archive, rank_dir)

    def seeded_summary(self) -> str | None:
        """LOAD: what Triton took from the archive so far, or None when nothing."""
        if self.triton is None or not (self.triton.seeded.files or self.triton.seeded.refused):
            return None
        return f"Triton kernels from the archive: {self.triton.seeded.describe()}"

    @contextlib.contextmanager
    def in_phase(self, phase: Any, then: Any, what: str) -> Iterator[None]:
        """Runs the body in start-up phase ``phase`` (``self.phase``, the plugin's enum), timed as
        ``what`` on the plugin's logger; afterwards, also when it raises, the phase becomes
        ``then`` and the region ends (:meth:`finish`, a no-op when it already ended). When the
        outermost phase ends, the process's critical path is logged (once per process)."""
        self.phase = phase
        self._phase_depth += 1
        try:
            with timed(what, self.logger):
                yield
        finally:
            self.phase = then
            self._phase_depth -= 1
            try:
                self.finish()
            finally:
                if self._phase_depth == 0:
                    self.ledger.report(self.logger, rank=getattr(self.session, "rank", None))

    def recorded_adapter_state(self) -> Mapping[str, Any]:
        """LOAD: what the adapter recorded at SAVE (``foundry_record_state`` in the archive's
        engine state), or an empty mapping when the archive has none."""
        state = self.session.recorded_state()
        return state.adapter if state is not None else {}

    def load_archive(self, instantiate: str, threads: int,
                     defer: Callable[[str], bool] | None = None) -> tuple[Any, float] | None:
        """LOAD: loads the archive's graphs (instantiated as ``instantiate`` with ``threads``, see
        :func:`foundry_core.engine.options.instantiate_mode`; those ``defer`` names at their first
        use) and keeps the archive alive in ``archive``. Returns (archive, seconds it took), or
        None when the session could not load it (it fell back already)."""
        start = time.perf_counter()
        archive = self.session.load(instantiate=instantiate, threads=threads, defer=defer)
        if archive is None:
            return None
        self.archive = archive
        return archive, time.perf_counter() - start

    def boundary(self) -> None:
        """The determinism boundary (after NCCL): from here on SAVE and LOAD must allocate alike."""
        self.session.determinism_boundary()
        if self.end_when_off_at_boundary and not self.active:
            self._ended = True
        if self.mode is Mode.LOAD and options.env_flag(IMAGES_AHEAD_ENV) and not self.lazy_instantiation():
            try:
                bind = self.device.thread_binder()
            except FoundryError as exc:
                self.logger.debug("foundry: kernel images not loaded ahead: %s", exc)
                return
            self.session.load_images_ahead(bind, warm_execs=options.env_flag(EXEC_WARMUP_ENV, default=False))

    def lazy_instantiation(self) -> bool:
        """Whether LOAD instantiates each graph at its first replay (then its images load only
        when a graph needs them, and nothing is loaded ahead). A plugin answers from its setting."""
        return False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Runs the body outside the region (see the module docstring): empties PyTorch's cache,
        stops the region, allocates from a private pool of its own, and on the way out lets the
        pool go, empties the cache again and resumes the region. Nested pauses and pauses while
        the region is closed do nothing special. Needs PyTorch 2.6 or later (a MemPool released
        with its last reference; the engines' pinned releases have 2.11), and a pause must not end
        while another thread captures a CUDA graph or allocates into another pool: PyTorch
        flushes a released pool's cache only with no capture under way."""
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
        pool = self.device.private_pool()
        try:
            with self.device.use_pool(pool):
                yield
        finally:
            # Letting the pool go releases it: PyTorch's MemPool destructor frees its unused
            # blocks at once, the rest when they are freed and the cache is flushed again (one
            # pool kept for the whole start would hold the profile's peak activations beyond the
            # engine's memory budget until the process ends).
            try:
                free = self.device.free_memory()
                pool = None
                self.device.empty_cache()
                self._log_returned(self.device.free_memory() - free)
            finally:
                self.device.resume_region()
                self._pause_depth -= 1

    def _log_returned(self, returned: int) -> None:
        level = logging.INFO if returned >= RETURNED_LOG_BYTES else logging.DEBUG
        self.logger.log(level, "foundry: the pause's pool and cache returned %.2f GiB to the device",
                        returned / (1 << 30))

    def skipped(self, what: str) -> None:
        """LOAD's stand-in for paused SAVE work: the same cache flushes, nothing in between."""
        with self.paused():
            pass
        self.logger.log(self.skip_level, "foundry: LOAD skips %s", what)

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
        normal path. Warns (``no_capture_warning``) when the capture seam was never reached."""
        if self._ended:
            return
        self._ended = True
        if self.active and not self.capture_seen:
            self.logger.warning("foundry: %s; %s", self.no_capture_warning,
                                "no archive was written" if self.mode is Mode.SAVE else "no graph was restored")
        self.session.end()


def start_runtime(rank: int, make_adapter: Callable[[], _A], make_runtime: Callable[[EngineSession, _A], _R], *,
                  session_factory: Callable[..., EngineSession] = EngineSession,
                  region: Callable[[], RegionRuntime] | None = None) -> _R | None:
    """A plugin's ``start()``: resolves FOUNDRY_ARCHIVE / FOUNDRY_MODE and, unless Foundry is
    off (then None), makes the rank's adapter (``make_adapter()``), its session
    (``session_factory(archive, mode, rank, plugin_manager, runtime=region())``; without
    ``region`` the session's default, libfoundry.so) and the runtime
    (``make_runtime(session, adapter)``), then launches it (:meth:`WorkerRuntime.launch`: the region is set).
    The plugin keeps the returned runtime as its process's current one."""
    settings = resolve_settings()
    if settings.mode is Mode.OFF:
        return None
    adapter = make_adapter()
    options = {} if region is None else {"runtime": region()}
    session = session_factory(settings.archive, settings.mode, rank, get_plugin_manager(adapter), **options)
    return make_runtime(session, adapter).launch(rank, settings.archive)


class RuntimeSlot(Generic[_R]):
    """This process's runtime of one plugin: engines run one model runner per process, so a
    plugin keeps one slot at module level; its seams read ``slot.runtime`` (None: Foundry off, or
    not started yet)."""

    def __init__(self) -> None:
        self.runtime: _R | None = None

    def keep(self, rt: _R | None) -> _R | None:
        """Makes ``rt`` this process's runtime unless it is None (Foundry off); returns ``rt``."""
        if rt is not None:
            self.runtime = rt
        return rt

    def reset(self) -> None:
        """Forgets this process's runtime (tests)."""
        self.runtime = None
