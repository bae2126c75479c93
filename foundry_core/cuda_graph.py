"""fdry.CUDAGraph: torch.cuda.CUDAGraph that keeps its CUgraph, with save and load."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from foundry_core.errors import InvalidArgumentError
from foundry_core.graphs import PendingGraphLoads, RestoredGraph, _save_single, load_graphs, save_graphs


class CUDAGraph(torch.cuda.CUDAGraph):
    """A torch CUDA graph that can be saved and restored in a fresh process.

    SAVE: capture with ``with fdry.graph(g): out = f(x)``, ``g.replay()``, then
    ``g.save("dir/graph.json", output_tensors=out)``. LOAD (same region, same allocations):
    ``g, out = fdry.CUDAGraph.load("dir/graph.json")``; ``g.replay()`` refreshes ``out``.
    """

    def __new__(cls, keep_graph: bool = True):
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = True):
        # torch's constructor runs again with the call's arguments: pass keep_graph explicitly,
        # or the default (False) would drop the CUgraph that SAVE reads.
        super().__init__(keep_graph)

    def save(self, path: str | os.PathLike, output_tensors: Any = None) -> None:
        """Saves this graph.

        A ``path`` ending in ``.json`` uses the single-graph layout: the manifest at ``path``, the
        payload beside it as ``<stem>.fgr``, the kernel images under ``<dir>/images/`` (shared by
        every graph saved into that directory; ``load_cuda_modules_and_libraries(dir)`` loads
        them). Any other ``path`` becomes an archive directory of its own.
        """
        p = Path(path)
        if p.suffix == ".json":
            _save_single(p, self, output_tensors)
        else:
            save_graphs(p, {p.name: (self, output_tensors)})

    @staticmethod
    def load(path: str | os.PathLike, pool: Any = None) -> tuple[RestoredGraph, Any]:
        """Restores a graph saved with :meth:`save`; returns ``(graph, outputs)``."""
        archive = load_graphs(path, mode="eager")
        if len(archive) != 1:
            raise InvalidArgumentError(f"{path} holds {len(archive)} graphs; use fdry.load_graphs for several")
        return archive[0], archive.outputs(0)

    @staticmethod
    def start_graph_builds(paths, pool: Any = None, num_threads: int = 4) -> PendingGraphLoads:
        """Starts restoring several saved graphs; instantiation runs on ``num_threads`` threads.
        With a ``graph_manifest.json`` (see :func:`save_graph_manifest`) beside them, graphs of one
        topology share a template."""
        return PendingGraphLoads.start([Path(p) for p in paths], num_threads)

    @staticmethod
    def finish_graph_loads(pending: PendingGraphLoads) -> list[tuple[RestoredGraph, Any]]:
        """Waits for every graph of :meth:`start_graph_builds`; returns ``[(graph, outputs), ...]``."""
        return pending.finish_all()

    @staticmethod
    def finish_one_graph_load(pending: PendingGraphLoads, index: int) -> tuple[RestoredGraph, Any]:
        """Makes graph ``index`` of :meth:`start_graph_builds` replayable; returns ``(graph, outputs)``."""
        return pending.finish_one(index)
