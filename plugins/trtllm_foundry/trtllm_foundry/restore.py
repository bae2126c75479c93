"""SAVE and LOAD of one decode graph over ``CUDAGraphRunner``'s contract, independent of TensorRT-LLM.

The contract (TensorRT-LLM 1.2 ``cuda_graph_runner.py``): ``capture(key, forward_fn,
initial_inputs, ...)`` slices the runner's ``shared_static_tensors`` (input ids, position ids)
into the inputs, stores ``graph_metadata[key] = {"attn_metadata": ..., "spec_metadata": ...}``,
runs ``WARMUP_STEPS`` (2) eager forwards, captures one forward into ``torch.cuda.CUDAGraph()``
under ``torch.cuda.graph(graph, pool=memory_pool)`` (one private pool shared by every graph), and
keeps ``graphs[key]`` and ``graph_outputs[key] = make_weak_ref(output)`` (non-owning views into
the pool). ``replay(key, inputs)`` copies the new inputs into the static tensors, calls
``graphs[key].replay()`` and returns ``graph_outputs[key]``; ``clear()`` calls ``reset()`` on
every graph.

- :func:`capture_for_save` runs the runner's own capture with ``torch.cuda.CUDAGraph`` naming
  Foundry's graph class (a torch graph that keeps its ``CUgraph``) and the warmup forwards handed
  to ``run_warmup`` (SAVE runs them paused), and returns what the archive needs: the graph, its
  output tensors and their layout, and the addresses of the inputs it reads (static tensors,
  metadata). A graph whose inputs moved during its own warmups cannot be restored (LOAD skips the
  warmups), so that is reported as the capture's ``problem``.
- :func:`install_restored` is LOAD's replacement of a capture: it fills ``graph_metadata``,
  ``graphs`` and ``graph_outputs`` as the capture would, with the restored graph and outputs, so
  TensorRT-LLM's own ``replay`` and ``clear`` use them unchanged.

The plugin's seam (capture_patches.py) and the GPU test's stand-in runner call these same
functions. torch is imported only by the functions that need it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from foundry_core.engine.capture import graph_name, keep_graphs, tensor_addresses
from foundry_core.errors import UnsupportedError

from trtllm_foundry import outputs

__all__ = ["Captured", "RestoredRunnerGraph", "watched_addresses", "address_problem", "moved_inputs",
           "capture_for_save", "install_restored", "uninstall", "graph_name"]


@dataclasses.dataclass
class Captured:
    """One graph as SAVE captured it: ``name`` (the archive's), the graph, its output tensors and
    layout (:mod:`trtllm_foundry.outputs`), the input addresses LOAD must find, and the
    ``problem`` that keeps it out of the archive (None when it can be saved)."""

    name: str
    graph: Any
    tensors: tuple[Any, ...] = ()
    layout: dict[str, Any] = dataclasses.field(default_factory=dict)
    addresses: dict[str, int] = dataclasses.field(default_factory=dict)
    problem: str | None = None


class RestoredRunnerGraph:
    """A restored graph in ``CUDAGraphRunner.graphs``: ``replay()`` launches it on the current
    stream; ``reset()`` (``clear()`` calls it) does nothing, the archive owns the graph."""

    def __init__(self, restored: Any) -> None:
        self.restored = restored
        self.name = getattr(restored, "name", "")

    def replay(self) -> None:
        self.restored.replay()

    def reset(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"RestoredRunnerGraph({self.name!r})"


def watched_addresses(runner: Any, initial_inputs: Mapping[str, Any]) -> dict[str, int]:
    """``{path: data_ptr}`` of the device memory a graph reads besides weights and KV cache: the
    runner's static input tensors and the key's attention / speculative metadata."""
    return tensor_addresses({"static": getattr(runner, "shared_static_tensors", None),
                             "attn_metadata": initial_inputs.get("attn_metadata"),
                             "spec_metadata": initial_inputs.get("spec_metadata")})


def _first(items: list[str], sep: str, limit: int = 3) -> str:
    """The first ``limit`` of ``items`` joined by ``sep``, then ``(and N more)`` when there are more."""
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return sep.join(items[:limit]) + more


def address_problem(name: str, saved: Mapping[str, int], now: Mapping[str, int], limit: int = 3) -> str | None:
    """Why graph ``name``'s inputs are not where SAVE had them (a path missing now, or at another
    address), or None when every saved path is where it was."""
    diffs = []
    for path, ptr in saved.items():
        if path not in now:
            diffs.append(f"{path} is missing (at SAVE {ptr:#x})")
        elif now[path] != ptr:
            diffs.append(f"{path} at {now[path]:#x}, at SAVE {ptr:#x}")
    return (f"graph {name!r}: " + _first(diffs, "; ", limit)) if diffs else None


def moved_inputs(name: str, before: Mapping[str, int], after: Mapping[str, int]) -> str | None:
    """SAVE: why the graph's inputs changed during its own warmups and capture (paths created or
    moved there), which LOAD, skipping them, could not reproduce; None when they did not."""
    created = sorted(set(after) - set(before))
    if created:
        return f"graph {name!r}: the warmup forwards created the inputs {_first(created, ', ')}"
    moved = [f"{p} from {before[p]:#x} to {after[p]:#x}" for p in before if p in after and after[p] != before[p]]
    return f"graph {name!r}: the warmup forwards moved the inputs {_first(moved, ', ')}" if moved else None


def _capturing() -> bool:
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


def capture_for_save(runner: Any, key: Any, forward_fn: Callable[[Any], Any], initial_inputs: Mapping[str, Any],
                     capture: Callable[[Callable[[Any], Any]], Any],
                     run_warmup: Callable[[Callable[[], Any]], Any]) -> Captured:
    """SAVE: ``capture(forward)`` runs the runner's own capture (the seam's original, with its
    other arguments bound) with Foundry's graph class; ``forward`` calls ``forward_fn`` directly
    inside the capture and through ``run_warmup(thunk)`` outside it (the warmup forwards).
    Returns the :class:`Captured` graph; its ``problem`` says why it cannot be archived."""
    name = graph_name(key)
    before = watched_addresses(runner, initial_inputs)

    def forward(inputs: Any) -> Any:
        if _capturing():
            return forward_fn(inputs)
        return run_warmup(lambda: forward_fn(inputs))

    with keep_graphs():
        capture(forward)
    graph = runner.graphs[key]
    captured = Captured(name, graph, addresses=before)
    captured.problem = moved_inputs(name, before, watched_addresses(runner, initial_inputs))
    if captured.problem is None:
        try:
            captured.tensors, captured.layout = outputs.flatten(runner.graph_outputs.get(key))
        except UnsupportedError as exc:
            captured.problem = f"graph {name!r}: {exc}"
    return captured


def install_restored(runner: Any, key: Any, initial_inputs: Mapping[str, Any], restored: Any,
                     restored_outputs: Any) -> None:
    """LOAD: puts the restored graph and its outputs where ``capture`` would have put the captured
    ones (``graph_metadata``, ``graphs``, ``graph_outputs``); ``memory_pool`` is left as it is (the
    restored graphs' memory is the archive's)."""
    runner.graph_metadata[key] = {"attn_metadata": initial_inputs.get("attn_metadata"),
                                  "spec_metadata": initial_inputs.get("spec_metadata")}
    runner.graphs[key] = RestoredRunnerGraph(restored)
    runner.graph_outputs[key] = restored_outputs


def uninstall(runner: Any, keys: list[Any]) -> None:
    """Removes what :func:`install_restored` put in for ``keys`` (before a fallback capture)."""
    for key in keys:
        runner.graphs.pop(key, None)
        runner.graph_outputs.pop(key, None)
        runner.graph_metadata.pop(key, None)
