"""Graph SAVE and LOAD.

SAVE reads captured graphs (torch ``CUDAGraph(keep_graph=True)`` or any raw ``CUgraph``), audits
every device pointer they hold against the allocation region, groups them by topology and writes
an archive directory::

    manifest.json     format version, fingerprint, region, graphs and their outputs
    graphs.fgr        topology templates whole + per-graph deltas (checksummed container)
    images/*.fimg     the kernel images the graphs use, content-addressed
    alloc_log.json    the region's allocation log up to SAVE

LOAD, in a fresh process that set the same region and made the same allocations, loads the
images, maps the memory the graphs reference at its recorded addresses, and gives each graph its
own executable instance.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundry_core import _native, images
from foundry_core.errors import (
    ArchiveIOError,
    DivergenceError,
    FormatError,
    InvalidArgumentError,
    StateError,
)
from foundry_core.fingerprint import check_fingerprint, current_fingerprint
from foundry_core.manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    KnownManifest,
    parse_json,
    read_archive_file,
    read_manifest,
    write_manifest,
)
from foundry_core.region import LogEntry, allocation_log, placement_divergence, region_info
from foundry_core.tensors import describe_outputs, rebuild_outputs

logger = logging.getLogger("foundry")

PAYLOAD_NAME = "graphs.fgr"
LOG_NAME = "alloc_log.json"
MODES = ("eager", "parallel", "lazy", "background")


def _torch():
    import torch

    return torch


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="graph", disable=total < 16 or not os.isatty(2), leave=False)


def _device_arch() -> int:
    torch = _torch()
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def _raw_graph(graph: Any) -> int:
    """The CUgraph handle of a torch graph (captured with keep_graph=True) or an int handle."""
    if isinstance(graph, int):
        return graph
    try:
        return int(graph.raw_cuda_graph())
    except (AttributeError, RuntimeError) as exc:
        raise InvalidArgumentError(
            "cannot read the captured graph: capture it with torch.cuda.CUDAGraph(keep_graph=True) "
            f"(or fdry.CUDAGraph()) and save it before reset() ({exc})") from None


# ---- capture ------------------------------------------------------------------------------


def graph(cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"):
    """Capture context manager, as ``torch.cuda.graph``; capture into a graph that keeps its
    CUgraph (``fdry.CUDAGraph()`` or ``torch.cuda.CUDAGraph(keep_graph=True)``) to save it."""
    torch = _torch()
    return torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode)


# ---- SAVE ---------------------------------------------------------------------------------


@dataclass
class SaveReport:
    graphs: int
    groups: int
    nodes: int
    images: int
    seconds: float
    path: Path


def _read_into_saver(saver: ctypes.c_void_p, graphs: Mapping[str, tuple[Any, Any]]) -> list[dict]:
    described = []
    with _progress(len(graphs), "reading graphs") as bar:
        for name, (g, outputs) in graphs.items():
            _native.call("foundry_saver_add", saver, _raw_graph(g), name.encode())
            described.append({"name": name, "outputs": describe_outputs(outputs)})
            bar.update(1)
    return described


def _manifest(payload: str, graphs: list[dict], extra_fingerprint: dict | None) -> dict:
    info = region_info()
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "fingerprint": current_fingerprint(extra_fingerprint),
        "payload": payload,
        "region": {"base": info.base, "size": info.size, "high_water": info.high_water},
        "graphs": graphs,
        "log": LOG_NAME,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_log(path: Path) -> None:
    entries = [[e.seq, e.kind, e.offset, e.size, e.tag] for e in allocation_log()]
    with open(path, "w") as f:
        json.dump(entries, f)
        f.flush()
        os.fsync(f.fileno())


def _write_payload(directory: Path, payload_name: str, graphs: Mapping[str, tuple[Any, Any]],
                   images_root: Path | None = None) -> tuple[list[dict], _native.SaveStats]:
    """Writes the payload into ``directory`` and the images under ``images_root/images/``
    (default: ``directory``)."""
    _torch().cuda.synchronize()
    saver = ctypes.c_void_p()
    _native.call("foundry_saver_new", ctypes.byref(saver))
    try:
        described = _read_into_saver(saver, graphs)
        stats = _native.SaveStats()
        _native.call("foundry_saver_write", saver, os.fsencode(directory / payload_name),
                     os.fsencode(images_root or directory), _device_arch(), ctypes.byref(stats))
        return described, stats
    finally:
        _native.lib().foundry_saver_free(saver)


def save_graphs(directory: str | os.PathLike, graphs: Mapping[str, tuple[Any, Any]],
                fingerprint: dict | None = None) -> SaveReport:
    """Writes an archive directory holding ``graphs`` (``{name: (graph, outputs)}``).

    The directory appears atomically: it is written beside its final place and renamed into it,
    so a crash leaves either the previous archive or none. ``fingerprint`` adds fields (engine,
    model, ...) that LOAD must find equal. Raises AuditError when a graph references memory
    LOAD could not reproduce, UnsupportedError for nodes that cannot be persisted.
    """
    if not graphs:
        raise InvalidArgumentError("no graphs to save")
    start = time.perf_counter()
    final = Path(directory).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.staging.{os.getpid()}.{threading.get_ident()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        described, stats = _write_payload(staging, PAYLOAD_NAME, graphs)
        _write_log(staging / LOG_NAME)
        write_manifest(staging / MANIFEST_NAME, _manifest(PAYLOAD_NAME, described, fingerprint))
        _publish(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report = SaveReport(stats.graphs, stats.templates, stats.nodes, stats.images, time.perf_counter() - start, final)
    logger.info("saved %d graphs (%d groups, %d nodes, %d images) to %s in %.2f s", report.graphs, report.groups,
                report.nodes, report.images, final, report.seconds)
    return report


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(staging: Path, final: Path) -> None:
    """Renames the staging directory into place, replacing an older archive."""
    _fsync_dir(staging)
    old = None
    if final.exists() or final.is_symlink():
        if not final.is_dir() or final.is_symlink():
            raise StateError(f"{final} exists and is not an archive directory; refusing to replace it")
        old = final.parent / f".{final.name}.old.{os.getpid()}"
        try:
            os.rename(final, old)
        except FileNotFoundError:
            old = None  # another writer moved it aside first
    try:
        os.rename(staging, final)
    except OSError as exc:
        # Another SAVE published into the same place between our renames: its archive stands.
        raise ArchiveIOError(f"{final}: another SAVE published an archive here concurrently; this one was "
                             f"discarded ({exc.strerror})") from None
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _save_single(manifest_path: Path, g: Any, outputs: Any) -> None:
    directory = manifest_path.parent.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    payload = manifest_path.stem + ".fgr"
    described, _ = _write_payload(directory, payload, {manifest_path.stem: (g, outputs)},
                                  directory / images.SINGLE_GRAPH_IMAGES)
    manifest = _manifest(payload, described, None)
    manifest["log"] = manifest_path.stem + ".log.json"
    _write_log(directory / manifest["log"])
    write_manifest(manifest_path, manifest)


def save_graph_manifest(directory: str | os.PathLike) -> Path:
    """Regroups the single graphs saved in ``directory`` (``*.json`` from ``CUDAGraph.save``) into
    one payload with shared topology templates, and writes ``graph_manifest.json`` listing them.
    Later :meth:`CUDAGraph.start_graph_builds` over those paths builds each template once."""
    d = Path(directory)
    manifests = sorted(p for p in d.glob("*.json") if p.name not in ("graph_manifest.json",) and not p.name.endswith(".log.json"))
    entries = []
    for p in manifests:
        m = read_manifest(p)
        entries.append((p, m))
    if not entries:
        raise InvalidArgumentError(f"no saved graphs (*.json) in {d}")
    inputs = [os.fsencode(d / m["payload"]) for _, m in entries]
    arr = (ctypes.c_char_p * len(inputs))(*inputs)
    templates = ctypes.c_uint32()
    _native.call("foundry_payload_merge", arr, len(inputs), os.fsencode(d / "graph_manifest.fgr"), ctypes.byref(templates))
    first = entries[0][1]
    merged = dict(first)
    merged["payload"] = "graph_manifest.fgr"
    merged["graphs"] = [g for _, m in entries for g in m["graphs"]]
    merged["members"] = [p.name for p, _ in entries]
    merged["groups"] = templates.value
    out = d / "graph_manifest.json"
    write_manifest(out, merged)
    return out


# ---- LOAD ---------------------------------------------------------------------------------


class RestoredGraph:
    """One restored graph: ``replay()`` launches it on the current stream, like a captured graph."""

    def __init__(self, archive: GraphArchive, index: int, name: str):
        self._archive = archive
        self.index = index
        self.name = name

    def replay(self, stream: Any = None) -> None:
        torch = _torch()
        s = stream if stream is not None else torch.cuda.current_stream()
        _native.call("foundry_graphset_launch", self._archive._handle, self.index, s.cuda_stream)

    def instantiate(self) -> None:
        """Instantiates the graph now unless it is already (a graph :func:`load_graphs` deferred,
        or any graph in lazy and background mode). Raises FoundryError naming the graph when the
        driver refuses it; a replay would have raised the same, later."""
        _native.call("foundry_graphset_instantiate", self._archive._handle, self.index)

    def ready(self) -> bool:
        """True when the graph is instantiated (a replay will not instantiate it first)."""
        out = ctypes.c_int()
        _native.call("foundry_graphset_ready", self._archive._handle, self.index, ctypes.byref(out))
        return bool(out.value)

    def exec_flags(self) -> int:
        """The ``cudaGraphInstantiateFlags`` the driver reports for its executable graph, the same
        as for a graph PyTorch captured; raises FoundryError before it is instantiated."""
        out = ctypes.c_uint64()
        _native.call("foundry_graphset_exec_flags", self._archive._handle, self.index, ctypes.byref(out))
        return out.value

    def __repr__(self) -> str:
        return f"RestoredGraph({self.name!r}, index={self.index})"


@dataclass
class LoadTimes:
    # Lazy mode: images_s and read_s are the reading and checking at open; the driver's image
    # loads and each graph's delta come later, inside that graph's build and instantiation.
    images_s: float = 0.0
    read_s: float = 0.0
    claim_s: float = 0.0
    build_s: float = 0.0
    # Writing graphs' deltas into their templates, summed over threads. In eager mode (and with
    # deferred graphs) it is not part of instantiate_s; in parallel mode instantiate_s is the wall
    # time of the whole step. A snapshot at the end of load_graphs: graphs instantiated later
    # (lazy, background, deferred) add to native_times(), not here.
    update_s: float = 0.0
    instantiate_s: float = 0.0
    outputs_s: float = 0.0  # output tensors made so far: each at its graph's first use (GraphArchive.outputs)
    mapped_blocks: int = 0
    existing_blocks: int = 0
    nccl_events: int = 0  # archived events that are now the live NCCL's serial event (docs/multi-gpu.md)
    extra: dict = field(default_factory=dict)

    def breakdown(self) -> str:
        """The steps of a restore, for a log line: ``images 0.00 s, read 0.01 s, ...``."""
        steps = (("images", self.images_s), ("read", self.read_s), ("claims", self.claim_s), ("build", self.build_s),
                 ("deltas", self.update_s), ("instantiate", self.instantiate_s), ("outputs", self.outputs_s))
        return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in steps)


def _native_times(handle: ctypes.c_void_p) -> LoadTimes:
    """The graph set's native times so far (read, claims, builds, delta writes, blocks)."""
    native = _native.LoadTimes()
    _native.call("foundry_graphset_info", handle, None, None, ctypes.byref(native))
    return LoadTimes(read_s=native.read_s, claim_s=native.claim_s, build_s=native.build_s, update_s=native.update_s,
                     mapped_blocks=native.mapped_blocks, existing_blocks=native.existing_blocks,
                     nccl_events=native.nccl_events)


def payload_graph_names(handle: ctypes.c_void_p, count: int) -> list[str]:
    buf = ctypes.create_string_buffer(4096)
    names = []
    for i in range(count):
        _native.call("foundry_graphset_name", handle, i, buf, len(buf))
        names.append(buf.value.decode(errors="replace"))
    return names


def check_graph_names(manifest_path: Path, listed: list[str], stored: list[str]) -> None:
    """The manifest and the payload must list the same graphs in the same order: the manifest's
    names and outputs are attached to the payload's graphs by position."""
    if len(listed) != len(stored):
        raise FormatError(f"{manifest_path}: the manifest lists {len(listed)} graphs, the payload holds {len(stored)}")
    for i, (a, b) in enumerate(zip(listed, stored)):
        if a != b:
            raise FormatError(f"{manifest_path}: graph {i} is {a!r} in the manifest but {b!r} in the payload")


_NOT_BUILT = object()


class GraphArchive(Sequence):
    """The graphs of one archive, restored. Index it (or :meth:`get` by name) for RestoredGraph."""

    def __init__(self, manifest_path: Path, manifest: dict, handle: ctypes.c_void_p, times: LoadTimes):
        self.path = manifest_path
        self.manifest = manifest
        self._handle = handle
        self.times = times
        self._graphs = [RestoredGraph(self, i, g["name"]) for i, g in enumerate(manifest["graphs"])]
        self._by_name = {g.name: g for g in self._graphs}
        # Rebuilt at first use: an engine may ask for few of them (pieces of the sizes it serves),
        # and the manifest's check has already refused a malformed description.
        self._outputs: list[Any] = [_NOT_BUILT] * len(self._graphs)
        self._outputs_lock = threading.Lock()  # one set of tensors per graph, whichever thread asks first
        count, groups = ctypes.c_uint64(), ctypes.c_uint64()
        _native.call("foundry_graphset_info", handle, ctypes.byref(count), ctypes.byref(groups), None)
        check_graph_names(manifest_path, [g.name for g in self._graphs], payload_graph_names(handle, count.value))
        self.groups = groups.value

    def __len__(self) -> int:
        return len(self._graphs)

    def __getitem__(self, i):  # type: ignore[override]
        return self._graphs[i]

    def get(self, name: str) -> RestoredGraph:
        return self._by_name[name]

    def outputs(self, i: int) -> Any:
        """The output tensors of graph ``i`` (they alias the graph's memory, like captured outputs),
        made at the first call and the same objects afterwards; ``times.outputs_s`` adds up the
        time spent making them."""
        built = self._outputs[i]
        if built is not _NOT_BUILT:
            return built
        with self._outputs_lock:
            if self._outputs[i] is _NOT_BUILT:
                start = time.perf_counter()
                self._outputs[i] = rebuild_outputs(self.manifest["graphs"][i]["outputs"], self)
                self.times.outputs_s += time.perf_counter() - start
            return self._outputs[i]

    def instantiate_all(self, threads: int = 1, defer: Callable[[str], bool] | None = None) -> float:
        """Instantiates every graph not yet instantiated, except those whose name ``defer``
        accepts (then on this thread, whatever ``threads``); returns the seconds it took."""
        if defer is not None:
            return self.instantiate_some([g.index for g in self._graphs if not defer(g.name)])
        if threads <= 1:
            return self.instantiate_some(range(len(self)))
        start = time.perf_counter()
        _native.call("foundry_graphset_instantiate_all", self._handle, threads)
        return time.perf_counter() - start

    def instantiate_some(self, indices: Sequence[int]) -> float:
        """Instantiates the graphs at ``indices`` not yet instantiated, in order, on this thread;
        returns the seconds it took."""
        start = time.perf_counter()
        with _progress(len(indices), "instantiating graphs") as bar:
            for i in indices:
                _native.call("foundry_graphset_instantiate", self._handle, i)
                bar.update(1)
        return time.perf_counter() - start

    def native_times(self) -> LoadTimes:
        """The native work of this LOAD so far, read now. In lazy and background mode it grows as
        graphs are first used: ``read_s`` (their deltas read and checked), ``build_s`` (image loads,
        function attributes, template builds), ``update_s`` (their deltas written into templates)."""
        return _native_times(self._handle)

    def start_background(self) -> None:
        """Instantiates the graphs on a background thread; a replay before that instantiates inline."""
        _native.call("foundry_graphset_start_background", self._handle)

    def close(self) -> None:
        if self._handle:
            _native.lib().foundry_graphset_free(self._handle)
            self._handle = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


MAX_LOG_BYTES = 1 << 30


def read_saved_log(path: Path) -> list[LogEntry]:
    rows = parse_json(read_archive_file(path, "allocation log", MAX_LOG_BYTES), str(path), "allocation log")
    if not isinstance(rows, list):
        raise FormatError(f"{path}: not an allocation log")
    try:
        return [LogEntry(int(r[0]), str(r[1]), int(r[2]), int(r[3]), str(r[4])) for r in rows]
    except (TypeError, ValueError, IndexError):
        raise FormatError(f"{path}: malformed allocation log entry") from None


def check_allocations(directory: Path, manifest: dict) -> None:
    """Compares this process's region placements so far with SAVE's log, before any graph exists.

    A buffer placed elsewhere than at SAVE (an input allocated in another order, say) would make a
    restored graph read the wrong memory; this names the first such allocation. In strict mode
    (FOUNDRY_STRICT=1) it raises DivergenceError; otherwise it logs a warning.
    """
    log_path = directory / manifest.get("log", LOG_NAME)
    divergence = placement_divergence(read_saved_log(log_path))
    if divergence is None:
        return
    message = f"{divergence}: the buffers of this process are not where SAVE put them"
    if _native.lib().foundry_get_strict():
        raise DivergenceError(message)
    logger.warning("%s; restored graphs may read the wrong memory", message)


def _resolve_manifest(path: Path) -> Path:
    if path.is_dir():
        return path / MANIFEST_NAME
    return path


def open_archive(path: str | os.PathLike, check_environment: bool = True,
                 fingerprint: dict | None = None, known: KnownManifest | None = None) -> tuple[Path, dict]:
    """Reads and checks an archive's manifest (structure, then fingerprint); returns (path, manifest).
    ``known``: the manifest as the caller read it before, used while its file is unchanged."""
    manifest_path = _resolve_manifest(Path(path))
    manifest = known.current(manifest_path) if known is not None else None
    if manifest is None:
        manifest = read_manifest(manifest_path)
    if check_environment:
        check_fingerprint(manifest["fingerprint"], current_fingerprint(fingerprint))
    return manifest_path, manifest


def load_graphs(path: str | os.PathLike, mode: str = "eager", threads: int = 4,
                fingerprint: dict | None = None, defer: Callable[[str], bool] | None = None,
                known: KnownManifest | None = None) -> GraphArchive:
    """Restores the graphs of an archive (directory, or a single graph's ``.json``).

    mode: ``eager`` instantiates every graph now on this thread; ``parallel`` uses ``threads``
    threads; ``lazy`` reads and instantiates each graph at its first replay (a corrupt graph is
    then reported at that replay); ``background`` starts a thread that instantiates them all
    while the caller goes on (a replay before that instantiates inline).
    defer: in eager and parallel mode, the graphs whose name it accepts are read and checked now
    but instantiated at their first :meth:`RestoredGraph.instantiate` or replay (an engine that
    uses few of them, and can run one without its graph when the driver refuses it), the others
    now on this thread (also in parallel mode). Ignored in lazy and background mode.
    known: the archive's manifest as the caller read it (:class:`~foundry_core.manifest.KnownManifest`),
    used instead of reading it again while its file is unchanged.
    The allocation region must be set as at SAVE. Raises MismatchError naming the fingerprint
    field when the archive comes from another environment, FormatError when it is corrupt.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"unknown instantiation mode {mode!r}; choose one of {', '.join(MODES)}")
    torch = _torch()
    torch.cuda.synchronize()
    # Capture released the caching allocator's unused segments (torch.cuda.graph empties the
    # cache); do the same so the graph memory's recorded ranges are free here too.
    torch.cuda.empty_cache()
    manifest_path, manifest = open_archive(path, fingerprint=fingerprint, known=known)
    directory = manifest_path.parent
    if manifest["region"]["size"]:
        check_allocations(directory, manifest)
    times = LoadTimes()
    start = time.perf_counter()
    images.load_cuda_modules_and_libraries(directory, lazy=mode == "lazy")
    times.images_s = time.perf_counter() - start
    handle = ctypes.c_void_p()
    # Lazy instantiation reads each graph's delta when it reaches the graph; the other modes read
    # (and check) every delta now, so a corrupt one cannot surface in the middle of serving.
    opener = "foundry_graphset_open_lazy" if mode == "lazy" else "foundry_graphset_open"
    _native.call(opener, os.fsencode(directory / manifest["payload"]), ctypes.byref(handle))
    native = _native_times(handle)
    times.read_s, times.claim_s, times.build_s = native.read_s, native.claim_s, native.build_s
    times.mapped_blocks, times.existing_blocks = native.mapped_blocks, native.existing_blocks
    times.nccl_events = native.nccl_events
    archive = GraphArchive(manifest_path, manifest, handle, times)
    if mode in ("eager", "parallel"):
        elapsed = archive.instantiate_all(1 if mode == "eager" else threads, defer)
        # Templates are built on first use, inside instantiation: report the two apart.
        build_before = times.build_s
        native = archive.native_times()
        times.build_s, times.update_s = native.build_s, native.update_s
        if mode == "eager" or defer is not None:  # one thread: the parts add up to the wall time
            times.instantiate_s = max(elapsed - (native.build_s - build_before) - native.update_s, 0.0)
        else:  # builds and writes overlap on the threads: report the step's wall time
            times.instantiate_s = elapsed
    elif mode == "background":
        archive.start_background()
    return archive


class PendingGraphLoads:
    """Restores started by :meth:`CUDAGraph.start_graph_builds`, finished one by one or all at once."""

    def __init__(self, archives: list[tuple[GraphArchive, int]], threads: list[threading.Thread]):
        self._entries = archives
        self._threads = threads

    @classmethod
    def start(cls, paths: list[Path], num_threads: int) -> PendingGraphLoads:
        if not paths:
            raise InvalidArgumentError("no graph paths given")
        merged = paths[0].parent / "graph_manifest.json"
        names = {p.name for p in paths}
        entries: list[tuple[GraphArchive, int]] = []
        if merged.is_file() and names <= set(read_manifest(merged).get("members", [])):
            archive = load_graphs(merged, mode="lazy")
            order = {m: i for i, m in enumerate(archive.manifest["members"])}
            entries = [(archive, order[p.name]) for p in paths]
            archives = [archive]
        else:
            archives = [load_graphs(p, mode="lazy") for p in paths]
            entries = [(a, 0) for a in archives]
        threads = []
        for a in archives:
            t = threading.Thread(target=a.instantiate_all, args=(num_threads,), daemon=True)
            t.start()
            threads.append(t)
        return cls(entries, threads)

    def finish_one(self, index: int) -> tuple[RestoredGraph, Any]:
        archive, i = self._entries[index]
        _native.call("foundry_graphset_instantiate", archive._handle, i)
        return archive[i], archive.outputs(i)

    def finish_all(self) -> list[tuple[RestoredGraph, Any]]:
        for t in self._threads:
            t.join()
        return [self.finish_one(i) for i in range(len(self._entries))]
