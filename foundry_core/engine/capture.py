"""Helpers for an engine plugin's CUDA-graph capture seams, independent of the engine.

- naming and inspection (pure): :func:`graph_name` gives a capture key a stable name (the
  archive's graph names), :func:`tensor_addresses` lists the CUDA tensors reachable from an
  object (the attention metadata a graph reads) and :func:`address_mismatch` compares SAVE's
  addresses with this run's;
- the capture context: :func:`swapped` sets attributes for a block; :func:`keep_graphs` (SAVE)
  makes ``torch.cuda.CUDAGraph`` build graphs that keep their ``CUgraph``; :func:`neutralised`
  (LOAD) makes the engine's own capture loop create and capture nothing (:class:`PendingGraph`,
  :class:`NoCapture`), so its per-graph preparation runs in the same order as at SAVE while the
  restored graphs take the placeholders' places; :func:`inference_mode` as the engines capture.

torch is imported only by the functions that swap its attributes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

__all__ = ["MAX_DEPTH", "graph_name", "is_cuda_tensor", "tensor_addresses", "address_mismatch", "swapped",
           "PendingGraph", "NoCapture", "keep_graphs", "neutralised", "inference_mode"]

MAX_DEPTH = 5  # how deep tensor_addresses follows containers and attributes


# ---- naming and inspection (pure) ------------------------------------------------------------------


def _field_text(value: Any) -> str:
    return value.name if isinstance(value, enum.Enum) else str(value)


def graph_name(key: Any) -> str:
    """A stable name for a capture key (vLLM's ``BatchExecutionDescriptor``, SGLang's
    ``ShapeKey``): a dataclass's or named tuple's fields as ``name=value`` joined by commas, in
    declaration order, enums by member name (``size=8,mode=FULL``); any other key as its ``str``
    (an enum by its name)."""
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        items = [(f.name, getattr(key, f.name)) for f in dataclasses.fields(key)]
    elif hasattr(key, "_asdict"):
        items = list(key._asdict().items())
    else:
        return _field_text(key)
    return ",".join(f"{k}={_field_text(v)}" for k, v in items)


def is_cuda_tensor(obj: Any) -> bool:
    """A CUDA tensor (duck-typed: torch need not be imported to ask)."""
    return callable(getattr(obj, "data_ptr", None)) and getattr(obj, "is_cuda", False) is True


def tensor_addresses(obj: Any) -> dict[str, int]:
    """``{path: data_ptr}`` of every CUDA tensor reachable from ``obj`` through dicts (keys in
    ``str`` order), lists, tuples, named tuples, dataclasses and plain objects' attributes. Paths
    read like ``.field[key][0]`` (``""`` for ``obj`` itself); an object reached twice keeps its
    first path; a container nested more than :data:`MAX_DEPTH` levels deep is not followed."""
    out: dict[str, int] = {}
    seen: set[int] = set()

    def walk(value: Any, path: str, depth: int) -> None:
        if is_cuda_tensor(value):
            out.setdefault(path, int(value.data_ptr()))
            return
        if value is None or isinstance(value, (str, bytes, int, float, bool, enum.Enum)) or depth > MAX_DEPTH:
            return
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, Mapping):
            for key in sorted(value, key=str):
                walk(value[key], f"{path}[{key}]", depth + 1)
        elif isinstance(value, tuple) and hasattr(value, "_fields"):
            for name in value._fields:
                walk(getattr(value, name), f"{path}.{name}", depth + 1)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]", depth + 1)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name, None), f"{path}.{f.name}", depth + 1)
        elif hasattr(value, "__dict__") and not callable(value):
            for name, item in sorted(vars(value).items()):
                walk(item, f"{path}.{name}", depth + 1)

    walk(obj, "", 0)
    return out


def address_mismatch(saved: Mapping[str, Mapping[str, int]], now: Mapping[str, Mapping[str, int]]) -> str | None:
    """The first differences between SAVE's and this run's attention-metadata addresses
    (``{graph name: tensor_addresses(...)}``; only graphs and paths both sides have count), as
    ``graph 'g' metadata .x at 0x..., at SAVE 0x...`` joined by ``; `` (three at most, then
    ``(and N more)``), or None when they agree."""
    diffs = []
    for graph in saved:
        if graph not in now:
            continue
        for path, ptr in saved[graph].items():
            if path in now[graph] and now[graph][path] != ptr:
                diffs.append(f"graph {graph!r} metadata {path or '<root>'} at {now[graph][path]:#x}, at SAVE {ptr:#x}")
    if not diffs:
        return None
    more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
    return "; ".join(diffs[:3]) + more


# ---- the capture context ---------------------------------------------------------------------------


@contextlib.contextmanager
def swapped(owner: Any, **attrs: Any) -> Iterator[None]:
    """Sets attributes of ``owner`` for the duration of the block, then puts the old ones back
    (also when the block raises). AttributeError before anything is set when one is missing."""
    old = {name: getattr(owner, name) for name in attrs}
    for name, value in attrs.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(owner, name, value)


class PendingGraph:
    """What ``torch.cuda.CUDAGraph()`` returns during LOAD's neutralised loop: a placeholder the
    plugin replaces by the restored graph before the engine can replay it. Replaying it raises
    RuntimeError naming ``plugin`` (a subclass sets it)."""

    plugin: ClassVar[str] = "foundry"

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def replay(self, *_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError(f"{self.plugin}: a CUDA graph placeholder was replayed; the restore did not install its "
                           "graph")


class NoCapture:
    """What ``torch.cuda.graph(...)`` returns during LOAD's neutralised loop: captures nothing."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> bool:
        return False


def keep_graphs(**torch_cuda: Any) -> contextlib.AbstractContextManager[None]:
    """SAVE: inside the block ``torch.cuda.CUDAGraph`` builds graphs that keep their CUgraph
    (:class:`foundry_core.cuda_graph.CUDAGraph`), so they can be saved after capture. Further
    ``torch.cuda`` attributes to swap for the block may be given by name (e.g. ``graph=...``)."""
    import torch

    from foundry_core.cuda_graph import CUDAGraph

    return swapped(torch.cuda, CUDAGraph=CUDAGraph, **torch_cuda)


def neutralised(placeholder: type = PendingGraph, graph: Any = NoCapture) -> contextlib.AbstractContextManager[None]:
    """LOAD: inside the block no graph is created or captured: ``torch.cuda.CUDAGraph`` is
    ``placeholder`` (default :class:`PendingGraph`) and ``torch.cuda.graph`` is ``graph`` (default
    :class:`NoCapture`; a plugin may pass a context factory that also mirrors what SAVE's capture
    context does, e.g. empty PyTorch's cache)."""
    import torch

    return swapped(torch.cuda, CUDAGraph=placeholder, graph=graph)


def inference_mode() -> contextlib.AbstractContextManager[Any]:
    """``torch.inference_mode()``, as the engines capture: restored outputs are then inference
    tensors, like captured ones."""
    import torch

    return torch.inference_mode()
