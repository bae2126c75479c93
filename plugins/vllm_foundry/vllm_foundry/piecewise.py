"""Piecewise CUDA graphs (``FULL_AND_PIECEWISE``, vLLM's default mode, and ``PIECEWISE``):
saved and restored unless ``FOUNDRY_VLLM_PIECEWISE=0`` (docs/vllm-piecewise.md).

vLLM's V2 runner captures one graph per compiled piece (a ``CUDAGraphWrapper`` around each
``PiecewiseBackend``) and per ``PIECEWISE`` batch descriptor, inside the same
``CudaGraphManager.capture`` loop that captures the FULL graphs.

- **SAVE** (:func:`collect`): after that loop, every piece's entries are saved under
  ``pw:<prefix>:<index>/<total>:<descriptor>`` with their outputs; the addresses of their tensor
  arguments go into the engine state.
- **LOAD** (:class:`Pieces`): the loop runs neutralised, so no piece is captured; the wrappers are
  only made at the compiled model's first call, after the capture phase. The first time a wrapper
  is called for a descriptor it has no entry for, the restored graph becomes vLLM's own
  ``CUDAGraphEntry``, after checking that the call's tensor arguments sit where they sat at SAVE.
  A piece that cannot be restored (arguments moved, not in the archive, or its graph refused by
  the driver) runs **eagerly**, with a warning: vLLM would capture it in the middle of a real
  batch, and a capture records the kernels without running them, so that batch's outputs (and the
  KV cache written from them) would be garbage.
- ``FOUNDRY_VLLM_PIECE_INSTANTIATE`` (:func:`instantiation`) says when the pieces are
  instantiated. With eager or parallel instantiation the restore instantiates the FULL graphs
  only, and the pieces on a thread started after the restore (``background``, default: a piece
  installed before the thread reached it is instantiated then), or each piece when it is
  installed (``first-use``: the first batch of a size pays its pieces' instantiation once), or
  with every other graph in the restore (``restore``). On the H200 (8B shapes, 1887 pieces)
  ``background`` took 0.11-0.25 s of instantiation out of the restore, with the same tokens and
  step time. A piece the driver refuses runs eagerly (above).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from foundry_core.engine import options
from foundry_core.engine.capture import graph_name
from foundry_core.errors import FoundryError, UnsupportedError

from vllm_foundry.config import mode_name

logger = logging.getLogger("foundry.vllm")

ENV = "FOUNDRY_VLLM_PIECEWISE"
INSTANTIATE_ENV = "FOUNDRY_VLLM_PIECE_INSTANTIATE"
INSTANTIATE_MODES = ("restore", "first-use", "background")
PREFIX = "pw:"
STATE_KEY = "piecewise"

__all__ = ["EAGER", "ENV", "INSTANTIATE_ENV", "INSTANTIATE_MODES", "OTHER", "PREFIX", "Pieces", "READY", "collect",
           "disabled_reason", "enabled", "instantiation", "is_piece", "mark_unavailable", "piece_name", "wanted_sizes",
           "wrapper_key"]


_unavailable: str | None = None  # why this process's vLLM cannot restore pieces (a missing seam)


def enabled() -> bool:
    """Whether piecewise graphs are saved and restored: yes, unless ``FOUNDRY_VLLM_PIECEWISE=0``
    or the installed vLLM lacks a seam the pieces need (:func:`mark_unavailable`)."""
    return _unavailable is None and options.env_flag(ENV, default=True)


def instantiation(environ: Mapping[str, str] | None = None) -> str:
    """When LOAD instantiates the pieces (``FOUNDRY_VLLM_PIECE_INSTANTIATE``, one of
    :data:`INSTANTIATE_MODES`, default ``background``); InvalidArgumentError naming the variable
    for any other value."""
    return options.env_choice(INSTANTIATE_ENV, INSTANTIATE_MODES, "background", environ)


def disabled_reason() -> str:
    """Why :func:`enabled` is False, as the end of a sentence."""
    if _unavailable is not None:
        return f"this vLLM lacks a seam the pieces need ({_unavailable})"
    return f"{ENV}=0 turns them off"


def mark_unavailable(reason: str | None) -> None:
    """With a reason, the piecewise modes are refused from now on in this process (the FULL graphs
    still work); None when the seams are installed."""
    global _unavailable
    _unavailable = reason


def wrapper_key(wrapper: Any) -> str | None:
    """A piece's name, equal in every process: ``<compiled module prefix>:<index>/<pieces>``
    (None for a wrapper that is not around a ``PiecewiseBackend``)."""
    backend = getattr(wrapper, "runnable", None)
    index = getattr(backend, "piecewise_compile_index", None)
    total = getattr(backend, "total_piecewise_compiles", None)
    prefix = getattr(getattr(backend, "vllm_backend", None), "prefix", None)
    if not isinstance(index, int) or not isinstance(total, int) or not prefix:
        return None
    return f"{prefix}:{index}/{total}"


def piece_name(key: str, descriptor: Any) -> str:
    return f"{PREFIX}{key}:{graph_name(descriptor)}"


def is_piece(name: str) -> bool:
    return name.startswith(PREFIX)


def _piecewise_wrappers(wrappers: Iterable[Any]) -> list[tuple[str, Any]]:
    found = [(wrapper_key(w), w) for w in wrappers if mode_name(getattr(w, "runtime_mode", None)) == "PIECEWISE"]
    found = [(k, w) for k, w in found if k is not None]
    keys = [k for k, _ in found]
    if len(set(keys)) != len(keys):
        raise UnsupportedError(f"two compiled pieces have the same name ({sorted(keys)[:4]}...): vllm-foundry cannot "
                               "tell their graphs apart")
    return sorted(found, key=lambda kw: kw[0])


def _tensor_like(x: Any) -> bool:
    return hasattr(x, "data_ptr") and hasattr(x, "is_cuda")


def _check_outputs(name: str, output: Any) -> None:
    items = output if isinstance(output, (list, tuple)) else [output]
    if not all(_tensor_like(x) for x in items):
        kinds = sorted({type(x).__name__ for x in items if not _tensor_like(x)})
        raise UnsupportedError(f"piece {name} returns {', '.join(kinds)} besides tensors; its graph cannot be saved")


def collect(wrappers: Iterable[Any]) -> tuple[dict[str, tuple[Any, Any]], dict[str, Any]]:
    """SAVE: ({name: (graph, outputs)} of every captured piece, the engine state that LOAD checks).
    Raises UnsupportedError naming a piece that cannot be saved."""
    graphs: dict[str, tuple[Any, Any]] = {}
    inputs: dict[str, list[int]] = {}
    sizes: set[int] = set()
    keys = []
    for key, wrapper in _piecewise_wrappers(wrappers):
        keys.append(key)
        for descriptor, entry in getattr(wrapper, "concrete_cudagraph_entries", {}).items():
            if getattr(entry, "cudagraph", None) is None:
                continue
            name = piece_name(key, descriptor)
            _check_outputs(name, entry.output)
            graphs[name] = (entry.cudagraph, entry.output)
            inputs[name] = [int(a) for a in (getattr(entry, "input_addresses", None) or [])]
            sizes.add(int(getattr(descriptor, "num_tokens", -1)))
    return graphs, {"pieces": keys, "sizes": sorted(sizes), "inputs": inputs}


def wanted_sizes(manager: Any) -> list[int] | None:
    """The token counts of the PIECEWISE descriptors vLLM's loop covers (None when it has none)."""
    descs = getattr(manager, "_capture_descs", None)
    if not isinstance(descs, Mapping):
        return None
    sizes = {int(d.num_tokens) for group in descs.values() for d in group
             if mode_name(getattr(d, "cg_mode", None)) == "PIECEWISE"}
    return sorted(sizes) or None


def _tensor_addresses(args: tuple) -> list[int]:
    """The addresses vLLM records for a piece: every tensor argument's (duck-typed, as torch need
    not be imported to ask)."""
    return [a.data_ptr() for a in args if _tensor_like(a)]


# What Pieces.prepare tells the call seam.
READY = "ready"    # the wrapper has its entry (restored now or before): vLLM replays it
EAGER = "eager"    # no restored piece can serve this call: run the piece without a graph
OTHER = "other"    # not a piecewise call: vLLM's own path


class Pieces:
    """LOAD: the restored pieces by name, installed into vLLM's wrappers at their first call."""

    def __init__(self, graphs: Mapping[str, Any], outputs: Callable[[str], Any], state: Mapping[str, Any]):
        """``outputs(name)``: the restored output tensors of piece ``name``, asked for only when
        the piece is installed (most engines serve a few of the captured sizes)."""
        self._graphs = dict(graphs)
        self._outputs = outputs
        self._inputs = {k: list(v) for k, v in (state.get("inputs") or {}).items()}
        self._per_descriptor = max(len(state.get("pieces") or []), 1)
        self._eager: set[str] = set()
        self._done: dict[str, int] = {}  # descriptor name -> pieces installed for it
        self._instantiate_s: dict[str, float] = {}  # descriptor name -> seconds instantiating its pieces
        self.installed = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def prepare(self, wrapper: Any, args: tuple, entry_type: type, context: Any) -> str:
        """Called before each ``CUDAGraphWrapper.__call__``: READY when the wrapper has (now) an
        entry for the call's descriptor, EAGER when this piece must run without a graph, OTHER when
        the call is not a piecewise replay."""
        if context is None:
            return OTHER
        descriptor = getattr(context, "batch_descriptor", None)
        entries = getattr(wrapper, "concrete_cudagraph_entries", None)
        if descriptor is None or entries is None:
            return OTHER
        if descriptor in entries:
            return READY  # the common case, first: nothing else to look at
        if (mode_name(getattr(context, "cudagraph_runtime_mode", None)) != "PIECEWISE"
                or mode_name(getattr(wrapper, "runtime_mode", None)) != "PIECEWISE"):
            return OTHER
        key = wrapper_key(wrapper)
        name = piece_name(key, descriptor) if key else f"{PREFIX}?:{graph_name(descriptor)}"
        if name in self._eager:
            return EAGER
        saved = self._inputs.get(name)
        if name not in self._graphs or saved is None:
            return self._run_eagerly(name, "the archive holds no graph for it")
        if _tensor_addresses(args) != saved:
            return self._run_eagerly(name, "its tensor arguments are not where they were at SAVE")
        label = graph_name(descriptor)
        start = time.perf_counter()
        try:
            self._graphs[name].instantiate()  # done already unless the restore left it for now
        except FoundryError as exc:
            return self._run_eagerly(name, f"the driver did not instantiate its graph ({exc})")
        self._instantiate_s[label] = self._instantiate_s.get(label, 0.0) + time.perf_counter() - start
        entries[descriptor] = entry_type(batch_descriptor=descriptor, cudagraph=self._graphs[name],
                                         output=self._outputs(name), input_addresses=saved)
        self.installed += 1
        self._done[label] = self._done.get(label, 0) + 1
        if self._done[label] == self._per_descriptor:
            logger.info("foundry: restored pieces in use for %s (%d pieces, %.1f ms to instantiate, builds included)",
                        label, self._per_descriptor, 1e3 * self._instantiate_s[label])
        return READY

    def _run_eagerly(self, name: str, why: str) -> str:
        self._eager.add(name)
        logger.warning("foundry: piece %s runs without a CUDA graph: %s (capturing it now, in a real batch, "
                       "would not run it)", name, why)
        return EAGER
