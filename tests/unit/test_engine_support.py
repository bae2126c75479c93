"""Fakes shared by the test_engine_* files (no tests here): an engine adapter, a region runtime
that needs no GPU, hand-written rank archives, and stand-ins for save_graphs / load_graphs that
write and check those archives the way the real ones do (fingerprint compared field by field)."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from foundry_core.engine.layout import Topology, rank_dir, write_topology
from foundry_core.engine.state import EngineState, write_state
from foundry_core.errors import InvalidArgumentError
from foundry_core.fingerprint import check_fingerprint
from foundry_core.manifest import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, read_manifest, write_manifest

# What current_fingerprint() would report on the GPU machine.
ENVIRONMENT = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0", "driver_version": 13000,
               "cuda_runtime": "13.0", "torch_version": "2.9.0", "foundry_version": "0.1.0"}
REGION_BASE = 0x6000_0000_0000


class FakeAdapter:
    """An engine adapter answering every hook from its attributes (change them per test)."""

    def __init__(self, **overrides: Any) -> None:
        self.identity: Any = ("fakeengine", "1.2.3")
        self.model: Any = {"architecture": "Qwen3", "hidden_size": 4096, "layers": 36, "quant": None}
        self.sizes: Any = [1, 2, 4, 8]
        self.parallel: Any = {"tp": 1}
        self.dtype: Any = "bfloat16"
        self.knobs: Any = {"cudagraph_mode": "FULL_DECODE_ONLY"}
        self.state: Any = {"kv_cache_bytes": 8 << 30, "kv_cache_blocks": 4096, "block_size": 16}
        self.fallbacks: list[tuple[str, Any]] = []
        for key, value in overrides.items():
            setattr(self, key, value)

    def foundry_engine_identity(self):
        return self.identity

    def foundry_model_identity(self):
        return self.model

    def foundry_capture_sizes(self):
        return self.sizes

    def foundry_parallel_config(self):
        return self.parallel

    def foundry_dtype(self):
        return self.dtype

    def foundry_graph_knobs(self):
        return self.knobs

    def foundry_record_state(self):
        return self.state

    def foundry_on_fallback(self, reason, mode):
        self.fallbacks.append((reason, mode))


class FakeRuntime:
    """Region operations without a GPU: a cursor that allocations advance and seals move."""

    def __init__(self, cursor: int = 0) -> None:
        self.calls: list[tuple] = []
        self.base = 0
        self.size = 0
        self.cursor = cursor
        self.high_water = cursor
        self.active = False

    def set_region(self, base: int, size: int) -> None:
        self.calls.append(("set_region", base, size))
        self.base, self.size, self.active = base, size, True

    def seal(self, offset: int) -> None:
        self.calls.append(("seal", offset))
        if offset < self.cursor:
            raise InvalidArgumentError(f"cannot move the cursor back from {self.cursor} to {offset}")
        self.cursor = offset
        self.high_water = max(self.high_water, offset)

    def stop(self) -> None:
        self.calls.append(("stop",))
        self.active = False

    def allocate(self, n: int) -> None:
        self.cursor += n
        self.high_water = max(self.high_water, self.cursor)

    def region_info(self) -> SimpleNamespace:
        return SimpleNamespace(base=self.base, size=self.size, cursor=self.cursor, high_water=self.high_water)


def manifest_doc(fingerprint: dict, environment: dict | None = None) -> dict:
    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "fingerprint": {**(ENVIRONMENT if environment is None else environment), **fingerprint},
        "payload": "graphs.fgr", "region": {"base": REGION_BASE, "size": 1 << 40, "high_water": 1 << 30},
        "graphs": [{"name": f"bs={n}", "outputs": {"kind": "none", "tensors": []}} for n in (1, 2)],
        "log": "alloc_log.json", "created": "2025-01-01T00:00:00Z",
    }


def default_state(**overrides: Any) -> EngineState:
    fields: dict[str, Any] = dict(kv_cache_bytes=8 << 30, kv_cache_blocks=4096, region_base=REGION_BASE,
                                  region_size=512 << 30, region_high_water=100 << 30, scratch_boundary=4 << 30,
                                  capture_sizes=(1, 2, 4, 8), adapter={"block_size": 16})
    fields.update(overrides)
    return EngineState(**fields)


def write_rank_archive(directory: Path, fingerprint: dict | None = None, state: EngineState | None = None,
                       with_state: bool = True) -> Path:
    """A rank archive as save_graphs + EngineSession.save leave it (payload bytes are not real)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_manifest(directory / MANIFEST_NAME, manifest_doc(fingerprint or {}))
    (directory / "graphs.fgr").write_bytes(b"FGR-not-a-real-payload")
    (directory / "images").mkdir(exist_ok=True)
    (directory / "alloc_log.json").write_text("[]")
    if with_state:
        write_state(directory, state or default_state())
    return directory


def write_archive(archive: Path, topology: Topology, fingerprints: list[dict] | None = None) -> list[Path]:
    """engine.json plus one complete rank archive per rank of ``topology``."""
    write_topology(archive, topology)
    dirs = []
    for r in range(topology.world_size):
        fp = fingerprints[r] if fingerprints else {}
        dirs.append(write_rank_archive(rank_dir(archive, r), fp))
    return dirs


class FakeGraphIO:
    """Stand-ins for foundry_core.graphs.save_graphs / load_graphs (install with monkeypatch)."""

    def __init__(self, environment: dict | None = None) -> None:
        self.environment = dict(ENVIRONMENT if environment is None else environment)
        self.saved: list[tuple[Path, dict, dict]] = []
        self.loaded: list[tuple[Path, str, dict]] = []
        self.save_error: Exception | None = None
        self.load_error: Exception | None = None
        self.images_loaded: list[tuple[Path, str]] = []  # (directory, the loading thread's name)
        self.images_error: Exception | None = None
        self.known: list = []  # the KnownManifest each load_graphs got

    def save_graphs(self, directory, graphs, fingerprint=None):
        if self.save_error is not None:
            raise self.save_error
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for stale in d.iterdir():  # the real one replaces the whole directory
            if stale.is_file():
                stale.unlink()
        doc = manifest_doc(copy.deepcopy(fingerprint or {}), self.environment)
        write_manifest(d / MANIFEST_NAME, doc)
        (d / "graphs.fgr").write_bytes(b"FGR")
        (d / "images").mkdir(exist_ok=True)
        self.saved.append((d, dict(graphs), dict(fingerprint or {})))
        return SimpleNamespace(graphs=len(graphs), path=d)

    def load_graphs(self, path, mode="eager", threads=4, fingerprint=None, defer=None, known=None):
        if self.load_error is not None:
            raise self.load_error
        self.known.append(known)
        manifest = (known.current(Path(path) / MANIFEST_NAME) if known else None) or read_manifest(Path(path) / MANIFEST_NAME)
        check_fingerprint(manifest["fingerprint"], {**self.environment, **(fingerprint or {})})
        self.loaded.append((Path(path), mode, dict(fingerprint or {}), defer))
        return ["restored"] * len(manifest["graphs"])

    def open_archive(self, path, check_environment=True, fingerprint=None, known=None):
        manifest = (known.current(Path(path) / MANIFEST_NAME) if known else None) or read_manifest(Path(path) / MANIFEST_NAME)
        if check_environment:
            check_fingerprint(manifest["fingerprint"], {**self.environment, **(fingerprint or {})})
        return Path(path) / MANIFEST_NAME, manifest

    def load_images(self, directory, lazy=False):
        if self.images_error is not None:
            raise self.images_error
        self.images_loaded.append((Path(directory), threading.current_thread().name))
        return 1

    def install(self, monkeypatch) -> FakeGraphIO:
        import foundry_core.graphs
        import foundry_core.images

        monkeypatch.setattr(foundry_core.graphs, "save_graphs", self.save_graphs)
        monkeypatch.setattr(foundry_core.graphs, "load_graphs", self.load_graphs)
        monkeypatch.setattr(foundry_core.graphs, "open_archive", self.open_archive)
        monkeypatch.setattr(foundry_core.images, "load_cuda_modules_and_libraries", self.load_images)
        return self


def adapter_fingerprint(adapter: FakeAdapter, rank: int = 0) -> dict:
    """The engine fingerprint an EngineSession builds from ``adapter`` for ``rank``."""
    from foundry_core.engine.fingerprint import engine_fingerprint

    return engine_fingerprint(*adapter.identity, adapter.model, adapter.sizes, adapter.parallel, rank,
                              dtype=adapter.dtype, knobs=adapter.knobs)


class PluginArchive:
    """What load_graphs gives an engine plugin, over the outputs a SAVE kept in memory:
    ``restored(name, index)`` makes each graph, ``copy(tensor)`` each output tensor as a fresh
    process would rebuild it."""

    def __init__(self, graphs: dict[str, tuple], restored: Any, copy: Any):
        from foundry_core.graphs import LoadTimes

        self.graphs = [restored(name, i) for i, name in enumerate(graphs)]
        self._outputs = [tuple(copy(t) for t in graphs[name]) for name in graphs]
        self.closed = False
        self.times = LoadTimes()

    def __iter__(self):
        return iter(self.graphs)

    def __len__(self):
        return len(self.graphs)

    def outputs(self, i):
        return self._outputs[i]

    def close(self):
        self.closed = True


class PluginArchiveIO:
    """save_graphs / load_graphs / open_archive / load_images as an engine plugin's session calls
    them: the manifest and payload files for the session's completeness checks, the graph names
    and output tensors kept in memory. ``graph_type``: the class SAVE must capture with;
    ``restored`` and ``copy``: as for :class:`PluginArchive`."""

    def __init__(self, graph_type: type, restored: Any, copy: Any):
        self.graph_type, self.restored, self.copy = graph_type, restored, copy
        self.saved: dict[Path, dict[str, tuple]] = {}
        self.loaded: list[Path] = []
        self.images_loaded: list[Path] = []

    def save_graphs(self, directory, graphs, fingerprint=None):
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        doc = manifest_doc(dict(fingerprint or {}))
        doc["graphs"] = [{"name": n, "outputs": {"kind": "none", "tensors": []}} for n in graphs]
        write_manifest(d / MANIFEST_NAME, doc)
        (d / "graphs.fgr").write_bytes(b"FGR")
        (d / "images").mkdir(exist_ok=True)
        assert all(isinstance(g, self.graph_type) for g, _ in graphs.values()), "SAVE must capture with Foundry's graphs"
        self.saved[d] = {name: tuple(out) for name, (_, out) in graphs.items()}
        return SimpleNamespace(graphs=len(graphs), path=d)

    def load_graphs(self, path, mode="eager", threads=4, fingerprint=None, defer=None, known=None):
        d = Path(path)
        check_fingerprint(read_manifest(d / MANIFEST_NAME)["fingerprint"], {**ENVIRONMENT, **(fingerprint or {})})
        self.loaded.append(d)
        return PluginArchive(self.saved[d], self.restored, self.copy)

    def open_archive(self, path, check_environment=True, fingerprint=None, known=None):
        d = Path(path)
        manifest = read_manifest(d / MANIFEST_NAME)
        if check_environment:
            check_fingerprint(manifest["fingerprint"], {**ENVIRONMENT, **(fingerprint or {})})
        return d / MANIFEST_NAME, manifest

    def load_images(self, directory, lazy=False):
        self.images_loaded.append(Path(directory))
        return 0
