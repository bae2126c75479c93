"""EngineSession: the engine-agnostic SAVE/LOAD logic an engine plugin drives, one per rank.

Lifecycle (the plugin calls these at the engine's seams)::

    session = EngineSession(archive, requested_mode, rank, plugin_manager)
    session.begin()                  # before the first device allocation (before NCCL)
    ...                              # NCCL / communicator bring-up (varies between runs)
    session.determinism_boundary()   # seal: from here SAVE and LOAD allocate identically
    if session.mode is Mode.LOAD:
        kv_bytes = session.recorded_state().kv_cache_bytes   # instead of memory profiling
    ...                              # weights, KV cache, workspaces: same order on both sides
    graphs = session.load()          # LOAD: a GraphArchive, or None -> start normally
    if session.mode is Mode.SAVE:
        ...                          # warm up and capture as usual
        session.save({name: (graph, outputs)})
    session.end()                    # later allocations take the normal path

Fallback policy: a missing, stale (fingerprint or topology mismatch) or corrupt archive never
stops the engine. The session logs one line naming the cause, calls ``foundry_on_fallback`` and
the engine starts normally. In AUTO mode it then saves a fresh archive (``mode`` becomes SAVE);
after an explicit LOAD it leaves the archive alone (``mode`` becomes OFF) and logs at ERROR.
``FOUNDRY_FALLBACK=0`` turns every fallback into the error itself.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from foundry_core import graphs as graph_io
from foundry_core import exec_memory, images
from foundry_core.doctor import DEFAULT_REGION_BASE
from foundry_core.engine.critical_path import LEDGER
from foundry_core.engine.fingerprint import ParallelConfig, describe_mismatch, engine_fields, engine_fingerprint
from foundry_core.engine.images_ahead import ImagesAhead
from foundry_core.engine.layout import Topology, check_topology, rank_dir, write_topology
from foundry_core.engine.mode import Mode, is_complete, parse_mode, read_complete, resolve_mode
from foundry_core.engine.plugin_manager import FoundryPluginManager
from foundry_core.engine.state import EngineState, write_state
from foundry_core.errors import (
    ArchiveIOError,
    DivergenceError,
    FormatError,
    FoundryError,
    InvalidArgumentError,
    MismatchError,
    NotFoundError,
    StateError,
    VersionError,
)
from foundry_core.manifest import MANIFEST_NAME, KnownManifest, file_identity
from foundry_core.sizes import format_size, parse_size

logger = logging.getLogger("foundry")

FALLBACK_ENV = "FOUNDRY_FALLBACK"
REGION_BASE_ENV = "FOUNDRY_REGION_BASE"
REGION_SIZE_ENV = "FOUNDRY_REGION_SIZE"
SCRATCH_SIZE_ENV = "FOUNDRY_SCRATCH_SIZE"
DEFAULT_REGION_SIZE = 512 << 30
DEFAULT_SCRATCH_SIZE = 4 << 30
BOUNDARY_ALIGNMENT = 2 << 20

# Errors that mean "this archive cannot be used here"; anything else is a bug or a broken process.
ARCHIVE_PROBLEMS: tuple[type[FoundryError], ...] = (
    MismatchError, FormatError, VersionError, ArchiveIOError, NotFoundError, DivergenceError)
_FALSE = ("0", "false", "no", "off")
_TRUE = ("", "1", "true", "yes", "on")


class RegionRuntime(Protocol):
    """The region operations a session needs (foundry_core.region's by default; a fake in tests)."""

    def set_region(self, base: int, size: int) -> None: ...
    def seal(self, offset: int) -> None: ...
    def stop(self) -> None: ...
    def region_info(self) -> Any: ...  # with .base, .size, .cursor, .high_water


class NativeRegionRuntime:
    """RegionRuntime over libfoundry.so (needs a GPU and, for the CUDA runtime's allocations, the preload)."""

    def set_region(self, base: int, size: int) -> None:
        from foundry_core.region import set_allocation_region

        set_allocation_region(base, size)

    def seal(self, offset: int) -> None:
        from foundry_core.region import set_current_alloc_offset

        set_current_alloc_offset(offset)

    def stop(self) -> None:
        from foundry_core.region import stop_allocation_region

        stop_allocation_region()

    def region_info(self) -> Any:
        from foundry_core.region import require_region

        return require_region()


def fallback_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when FOUNDRY_FALLBACK is 0/false/no/off (an unusable archive is then an error)."""
    value = (os.environ if environ is None else environ).get(FALLBACK_ENV, "").strip().lower()
    if value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise InvalidArgumentError(f"{FALLBACK_ENV}={value!r}: use 1 (fall back to a normal start) or 0 (fail)")


def _size_setting(value: int | str | None, environ: Mapping[str, str], name: str, default: int) -> int:
    if value is None:
        value = environ.get(name, "").strip() or default
    try:
        return parse_size(value)
    except ValueError as exc:
        raise InvalidArgumentError(f"{name}: {exc}") from None


def _align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class EngineSession:
    """One rank's Foundry session: resolves the mode, drives the region, saves or loads the archive.

    archive: the archive directory (None: Foundry is off). requested: auto/save/load/off.
    rank: the global rank (its archive is ``<archive>/rank<rank>``). plugin_manager: the engine
    adapter's hooks (see hookspecs). runtime: the region operations (default: libfoundry.so).
    region_base / region_size / scratch_size: default FOUNDRY_REGION_BASE / FOUNDRY_REGION_SIZE /
    FOUNDRY_SCRATCH_SIZE, else 0x600000000000 / 512 GiB / 4 GiB; LOAD uses the archive's region.
    fallback: whether an unusable archive falls back to a normal start (default: FOUNDRY_FALLBACK).

    The mode is resolved here: read ``.mode`` (never AUTO), ``.fallback_reason`` (why an archive
    was not used, or None). Raises InvalidArgumentError when the adapter's answers are unusable,
    and, with fallback disabled, the error that made the archive unusable.
    """

    def __init__(self, archive: str | os.PathLike | None, requested: Mode | str, rank: int,
                 plugin_manager: FoundryPluginManager, *, runtime: RegionRuntime | None = None,
                 region_base: int | str | None = None, region_size: int | str | None = None,
                 scratch_size: int | str | None = None, fallback: bool | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.archive = Path(archive) if archive is not None and str(archive) else None
        self.requested = parse_mode(requested)
        self.rank = rank
        self.pm = plugin_manager
        self.runtime: RegionRuntime = runtime if runtime is not None else NativeRegionRuntime()
        self.region_base = _size_setting(region_base, env, REGION_BASE_ENV, DEFAULT_REGION_BASE)
        self.region_size = _size_setting(region_size, env, REGION_SIZE_ENV, DEFAULT_REGION_SIZE)
        self.scratch_size = _size_setting(scratch_size, env, SCRATCH_SIZE_ENV, DEFAULT_SCRATCH_SIZE)
        self.fallback_allowed = fallback_enabled(env) if fallback is None else fallback
        self.fallback_reason: str | None = None
        self.rank_dir: Path | None = rank_dir(self.archive, rank) if self.archive is not None else None
        self.fingerprint: dict[str, Any] = {}
        self.topology: Topology | None = None
        self._state: EngineState | None = None
        self._known: KnownManifest | None = None  # the manifest the check read, for the restore
        self._region_active = False
        self._boundary: int | None = None
        self._images_ahead: ImagesAhead | None = None  # running or not yet joined
        self._images_ahead_started = False
        self.mode = Mode.OFF
        if self.requested is Mode.OFF or self.rank_dir is None:
            self.mode = resolve_mode(self.requested, self.rank_dir)  # OFF, or no archive for save/load: raises
            return
        # Before the engine goes on: on its critical path (foundry_core.engine.critical_path).
        with LEDGER.timed("fingerprint"):
            self._gather()
        with LEDGER.timed("archive check"):
            self.mode = self._resolve()

    # ---- adapter answers -------------------------------------------------------------------

    def _first(self, hook: str) -> Any:
        value = getattr(self.pm.hook, hook)()
        if value is None:
            raise InvalidArgumentError(f"no engine adapter answered {hook} (it returned None)")
        return value

    def _knobs(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for answer in self.pm.hook.foundry_graph_knobs():
            if answer is None:
                continue
            if not isinstance(answer, Mapping):
                raise InvalidArgumentError(f"foundry_graph_knobs returned {type(answer).__name__}, expected a dict")
            for key, value in answer.items():
                if key in merged and merged[key] != value:
                    raise InvalidArgumentError(f"graph knob {key!r} has two values from two adapters: "
                                               f"{merged[key]!r} and {value!r}")
                merged[key] = value
        return merged

    def _gather(self) -> None:
        self.pm.validate()
        identity = self._first("foundry_engine_identity")
        if not isinstance(identity, (tuple, list)) or len(identity) != 2:
            raise InvalidArgumentError(f"foundry_engine_identity returned {identity!r}; expected (name, version)")
        name, version = identity
        try:
            parallel = ParallelConfig.from_value(self._first("foundry_parallel_config"))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"foundry_parallel_config: {exc}") from None
        self.fingerprint = engine_fingerprint(
            name, version, self._first("foundry_model_identity"), self._first("foundry_capture_sizes"), parallel,
            self.rank, dtype=self.pm.hook.foundry_dtype(), knobs=self._knobs())
        self.topology = Topology(name, version, parallel.world_size, parallel.tp, parallel.pp, parallel.dp,
                                 parallel.ep)

    # ---- mode resolution and fallback ------------------------------------------------------

    def _resolve(self) -> Mode:
        if self.requested is Mode.SAVE:
            return Mode.SAVE
        assert self.rank_dir is not None and self.archive is not None
        identity = file_identity(self.rank_dir / MANIFEST_NAME)  # before the read: see KnownManifest
        try:
            manifest, state = read_complete(self.rank_dir)
        except NotFoundError as exc:
            if self.requested is Mode.AUTO:
                logger.info("foundry: no archive for rank %d at %s; this start captures and saves one",
                            self.rank, self.rank_dir)
                return Mode.SAVE
            return self.fall_back(exc)
        except ARCHIVE_PROBLEMS as exc:
            return self.fall_back(exc)
        try:
            self._check_archive(manifest, state)
        except ARCHIVE_PROBLEMS as exc:
            return self.fall_back(exc)
        if identity is not None:
            self._known = KnownManifest(self.rank_dir / MANIFEST_NAME, identity, manifest)
        logger.info("foundry: rank %d loads the archive %s", self.rank, self.rank_dir)
        return Mode.LOAD

    def _check_archive(self, manifest: dict, state: EngineState) -> None:
        """Everything LOAD can check before touching the GPU: topology, every rank complete,
        the engine fingerprint of this rank's ``manifest``; keeps its recorded ``state``."""
        assert self.rank_dir is not None and self.archive is not None and self.topology is not None
        check_topology(self.archive, self.topology)
        for r in range(self.topology.world_size):
            if r != self.rank and not is_complete(rank_dir(self.archive, r)):
                raise FormatError(f"{self.archive}: rank {r} of {self.topology.world_size} has no complete archive; "
                                  "every rank must LOAD, or none")
        saved = engine_fields(manifest["fingerprint"])
        mismatch = describe_mismatch(saved, self.fingerprint)
        if mismatch:
            raise MismatchError(f"{self.rank_dir} is stale: {mismatch}")
        self._state = state

    def fall_back(self, cause: FoundryError) -> Mode:
        """Applies the fallback policy to ``cause``; returns the mode the engine continues in.

        Adapters call it when they find, at one of their own seams, that the archive cannot be
        used (e.g. the engine wants other capture sizes): the same log line, hook and mode change
        as the session's own checks, and with FOUNDRY_FALLBACK=0 the cause is raised."""
        # The archive's images are not loaded on behind the new mode's back (and a fresh SAVE
        # must not replace the directory while the thread reads it).
        self._wait_images_ahead()
        if not self.fallback_allowed:
            raise type(cause)(f"{cause} ({FALLBACK_ENV}=0: not starting without the archive)") from cause
        new = Mode.SAVE if self.requested is Mode.AUTO else Mode.OFF
        self.fallback_reason = str(cause)
        self._state = None
        self._known = None
        if new is Mode.SAVE:
            logger.warning("foundry: rank %d does not use the archive (%s); starting normally and saving a fresh one",
                           self.rank, cause)
        else:
            logger.error("foundry: rank %d cannot load the archive (%s); starting normally without it, the archive "
                         "is left as is (%s=0 makes this an error)", self.rank, cause, FALLBACK_ENV)
            self.end()
        self.mode = new
        self.pm.hook.foundry_on_fallback(reason=self.fallback_reason, mode=new)
        return new

    # ---- lifecycle -------------------------------------------------------------------------

    def begin(self) -> None:
        """Sets the allocation region; call before the engine's first device allocation.

        SAVE uses the configured base and size, LOAD the archive's. A no-op when the mode is OFF.
        """
        if self.mode is Mode.OFF:
            return
        if self._region_active:
            raise StateError("EngineSession.begin() was already called")
        base, size = self.region_base, self.region_size
        if self.mode is Mode.LOAD and self._state is not None:
            base, size = self._state.region_base, self._state.region_size
        self.runtime.set_region(base, size)
        self._region_active = True
        logger.debug("foundry: region %#x + %s set for %s", base, format_size(size), self.mode)

    def determinism_boundary(self) -> int | None:
        """Seals the region after the allocations that vary between runs (NCCL bring-up, ...).

        SAVE seals at ``max(scratch_size, 2 * cursor)`` rounded up to 2 MiB and records it; LOAD seals
        at the recorded offset (falling back when this run already allocated past it). Returns the
        offset sealed at, or None when the mode is OFF.
        """
        if self.mode is Mode.OFF:
            return None
        if not self._region_active:
            raise StateError("call EngineSession.begin() before determinism_boundary()")
        cursor = self.runtime.region_info().cursor
        if self.mode is Mode.LOAD:
            assert self._state is not None
            boundary = self._state.scratch_boundary
            if cursor > boundary:
                self.fall_back(DivergenceError(
                    f"the allocations before the determinism boundary reach offset {cursor:#x}, past the {boundary:#x} "
                    "SAVE sealed at"))
                if self.mode is Mode.OFF:
                    return None
        if self.mode is Mode.SAVE:
            boundary = _align_up(max(self.scratch_size, 2 * cursor), BOUNDARY_ALIGNMENT)
            size = self.runtime.region_info().size
            if boundary >= size:
                raise StateError(f"the determinism boundary {format_size(boundary)} does not fit in the region of "
                                 f"{format_size(size)}; raise {REGION_SIZE_ENV} or lower {SCRATCH_SIZE_ENV}")
        self.runtime.seal(boundary)
        self._boundary = boundary
        return boundary

    def recorded_state(self) -> EngineState | None:
        """The state SAVE recorded (KV-cache size, region, ...) when the mode is LOAD, else None."""
        return self._state if self.mode is Mode.LOAD else None

    def load(self, instantiate: str = "eager", threads: int = 4,
             defer: Callable[[str], bool] | None = None) -> graph_io.GraphArchive | None:
        """Restores this rank's graphs (see foundry_core.load_graphs for ``instantiate`` and
        ``defer``).

        Returns None when the mode is not LOAD or the archive turns out unusable (fallback policy):
        the engine must then warm up and capture as usual, and save() if ``mode`` became SAVE.
        Keep the returned archive alive as long as its graphs and outputs are used.
        """
        if self.mode is not Mode.LOAD:
            return None
        if not self._region_active:
            raise StateError("call EngineSession.begin() before load()")
        assert self.rank_dir is not None
        self._wait_images_ahead()
        try:
            restored = graph_io.load_graphs(self.rank_dir, mode=instantiate, threads=threads,
                                            fingerprint=self.fingerprint, defer=defer, known=self._known)
        except ARCHIVE_PROBLEMS as exc:
            self.fall_back(exc)
            return None
        logger.info("foundry: rank %d restored %d graphs from %s", self.rank, len(restored), self.rank_dir)
        return restored

    def load_images_ahead(self, bind: Callable[[], None], warm_execs: bool = False) -> None:
        """LOAD: starts handing this rank's kernel images to the driver on a thread
        (:mod:`foundry_core.engine.images_ahead`); :meth:`load` waits for it. ``bind`` makes the
        engine's CUDA device current on that thread. ``warm_execs``: the thread then also grows
        the driver's memory for the graphs' execs (:mod:`foundry_core.exec_memory`). Does nothing
        in another mode or when a thread was started before."""
        if self.mode is not Mode.LOAD or self._images_ahead is not None or self._images_ahead_started:
            return
        self._images_ahead_started = True
        assert self.rank_dir is not None
        directory, fingerprint, known = self.rank_dir, self.fingerprint, self._known
        payload: Path | None = None  # the manifest's payload file, once load() has read the manifest

        def load() -> None:
            nonlocal payload
            # Only the images of an archive made for this machine: the restore checks it again.
            manifest_path, manifest = graph_io.open_archive(directory, fingerprint=fingerprint, known=known)
            payload = manifest_path.parent / manifest["payload"]
            images.load_cuda_modules_and_libraries(directory)

        stop = ctypes.c_int(0)

        def warm() -> None:
            assert payload is not None  # warm runs only after load succeeded
            w = exec_memory.warm(payload, stop)
            stopped = "" if w.execs == w.graphs else f" (of {w.graphs}: stopped when the restore began)"
            logger.info("foundry: driver memory for %d graph execs%s (%d nodes) grown ahead on a thread in %.2f s",
                        w.execs, stopped, w.nodes, w.seconds)

        def stop_warm() -> None:
            stop.value = 1

        self._images_ahead = ImagesAhead(load, bind, then=warm if warm_execs else None,
                                         stop_then=stop_warm if warm_execs else None).start()

    def save(self, graphs: Mapping[str, tuple[Any, Any]]) -> graph_io.SaveReport | None:
        """Writes this rank's archive: ``graphs`` (``{name: (graph, outputs)}``), the fingerprint,
        then engine_state.json (last: its presence marks a finished SAVE) and engine.json.

        Call after capture, while the region is still set. A failed write logs at ERROR and returns
        None (the engine keeps running; ``mode`` becomes OFF) unless fallback is disabled.
        """
        if self.mode is not Mode.SAVE:
            raise StateError(f"save() needs mode save; this session is in mode {self.mode}")
        if self._boundary is None:
            raise StateError("call EngineSession.determinism_boundary() before capturing and saving")
        assert self.rank_dir is not None and self.archive is not None and self.topology is not None
        state = self._state_to_record()
        try:
            write_topology(self.archive, self.topology)
            report = graph_io.save_graphs(self.rank_dir, graphs, fingerprint=self.fingerprint)
            write_state(self.rank_dir, state)
        except (FoundryError, OSError) as exc:
            if not self.fallback_allowed:
                raise
            logger.error("foundry: rank %d could not save the archive %s (%s); the engine runs without it",
                         self.rank, self.rank_dir, exc)
            self.mode = Mode.OFF
            return None
        return report

    def _state_to_record(self) -> EngineState:
        record = self.pm.hook.foundry_record_state()
        if record is None:
            raise StateError("no engine adapter answered foundry_record_state; SAVE needs the KV-cache size")
        if not isinstance(record, Mapping):
            raise InvalidArgumentError(f"foundry_record_state returned {type(record).__name__}, expected a dict")
        for key in ("kv_cache_bytes", "kv_cache_blocks"):
            if key not in record:
                raise InvalidArgumentError(f"foundry_record_state did not report {key!r}")
        info = self.runtime.region_info()
        extra = {k: v for k, v in record.items() if k not in ("kv_cache_bytes", "kv_cache_blocks")}
        assert self._boundary is not None
        return EngineState(
            kv_cache_bytes=record["kv_cache_bytes"], kv_cache_blocks=record["kv_cache_blocks"],
            region_base=info.base, region_size=info.size, region_high_water=info.high_water,
            scratch_boundary=self._boundary, capture_sizes=tuple(self.fingerprint["engine.capture_sizes"]),
            adapter=extra)

    def end(self) -> None:
        """Stops the region: later allocations take the driver's normal path (memory already in
        the region stays valid). Idempotent."""
        self._wait_images_ahead()
        if self._region_active:
            self._region_active = False
            self.runtime.stop()

    def _wait_images_ahead(self) -> None:
        """Joins the images thread, once (load, a fallback or the end, whichever comes first)."""
        ahead, self._images_ahead = self._images_ahead, None
        if ahead is not None:
            ahead.wait()

    def __enter__(self) -> EngineSession:
        self.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    def __repr__(self) -> str:
        return f"EngineSession(rank={self.rank}, mode={self.mode}, archive={str(self.archive)!r})"
