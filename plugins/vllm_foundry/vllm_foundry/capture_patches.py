"""The CUDA-graph capture seams of vLLM's V2 model runner (``vllm/v1/worker/gpu/``).

``GPUModelRunner.capture_model`` marks the CAPTURE phase and ends the region when it returns.
``CudaGraphManager.capture`` (reached through ``ModelCudaGraphManager.capture``'s ``super()``
call) is where graphs are made:

- **SAVE** runs vLLM's own loop unchanged, except that ``torch.cuda.CUDAGraph`` names Foundry's
  graph class for the duration (a torch graph that keeps its ``CUgraph``), then saves every FULL
  graph with the persistent buffers it writes (``hidden_states`` and any auxiliary hidden states)
  as its outputs. vLLM's warmup forward and capture run in the region, like everything LOAD must
  find at the same address.
- **LOAD** restores the archive first, then runs vLLM's same loop with the forwards replaced by
  no-ops and ``torch.cuda.graph`` / ``torch.cuda.CUDAGraph`` neutralised: the attention-metadata
  preparation (``create_forward_fn``) still happens for every descriptor, in vLLM's order, as at
  SAVE (its dummy requests numbered rather than given random UUIDs); ``capture_model``'s opening
  full garbage collection does not. Each placeholder in
  ``self.graphs`` is then replaced by the restored graph of the same
  descriptor (objects with ``.replay()``), and ``hidden_states`` by the restored output tensors;
  the manager and the runtime keep the archive alive (vLLM keeps only what ``self.graphs`` holds).

Checks before a restored graph is used: the archive holds exactly the descriptors vLLM wants; the
output layout matches; and, where vLLM's factory returns the attention state (0.25), every CUDA
tensor reachable from the captured pass's attention metadata sits at the address it had at SAVE
(``FOUNDRY_VLLM_CHECK_METADATA=0`` turns this off). A failed check falls back: vLLM captures
normally (and auto mode writes a fresh archive).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from foundry_core.engine import Mode, capture
from foundry_core.engine.capture import (
    MAX_DEPTH,
    NoCapture,
    address_mismatch,
    graph_name,
    inference_mode,
    keep_graphs,
    swapped,
    tensor_addresses,
)
from foundry_core.errors import MismatchError, UnsupportedError

from vllm_foundry import modes, patching, piecewise, ranks, runtime, seams, workspace
from vllm_foundry.patching import SeamError
from vllm_foundry.runtime import Phase

logger = logging.getLogger("foundry.vllm")

_FALLBACK = object()

__all__ = ["MAX_DEPTH", "NoCapture", "PendingGraph", "PIECE_WRAPPERS", "WRAPPERS", "address_mismatch",
           "expected_names", "graph_name", "inference_mode", "install", "keep_graphs", "neutralised", "observing", "output_tensors", "swapped",
           "numbered_dummy_requests", "tensor_addresses", "without_gc_collect", "wrap_capture", "wrap_capture_model"]


def _split_factory_result(out: Any) -> tuple[Callable[..., Any], Any]:
    """vLLM 0.25's factory returns ``(forward_fn, attention_state)``, later ones ``forward_fn``."""
    if isinstance(out, tuple):
        return out[0], (out[1] if len(out) > 1 else None)
    return out, None


def observing(factory: Callable[..., Any], sink: dict[str, dict[str, int]], quiet: bool) -> Callable[..., Any]:
    """Wraps vLLM's ``create_forward_fn``: records the captured pass's metadata addresses in
    ``sink`` and, with ``quiet``, returns forward functions that do nothing (LOAD)."""

    def noop(*_args: Any, **_kwargs: Any) -> None:
        return None

    def create_forward_fn(desc: Any, warmup: bool, *args: Any, **kwargs: Any) -> Any:
        out = factory(desc, warmup, *args, **kwargs)
        fn, state = _split_factory_result(out)
        if not warmup and state is not None:
            sink[graph_name(desc)] = tensor_addresses(state)
        if not quiet:
            return out
        return (noop, *out[1:]) if isinstance(out, tuple) else noop

    return create_forward_fn


class PendingGraph(capture.PendingGraph):
    """What ``torch.cuda.CUDAGraph()`` returns during LOAD's neutralised loop; replaced by the
    restored graph before vLLM can replay it."""

    plugin: ClassVar[str] = "vllm-foundry"


def neutralised() -> contextlib.AbstractContextManager[None]:
    """LOAD: no graph is created or captured."""
    return capture.neutralised(PendingGraph, NoCapture)


def expected_names(manager: Any) -> list[str] | None:
    """The FULL descriptors vLLM will capture, by name (None when the manager does not say)."""
    descs = getattr(manager, "_capture_descs", None)
    if not isinstance(descs, Mapping):
        return None
    return [graph_name(d) for group in descs.values() for d in group
            if modes.mode_name(getattr(d, "cg_mode", None)) == "FULL"]


def output_tensors(manager: Any) -> tuple[Any, ...] | None:
    """The persistent buffers the FULL graphs write: hidden_states, then aux hidden states."""
    hidden = getattr(manager, "hidden_states", None)
    if hidden is None:
        return None
    return (hidden, *list(getattr(manager, "aux_hidden_states", None) or []))


# ---- SAVE ----------------------------------------------------------------------------------------


def _capture_and_save(rt: runtime.WorkerRuntime, manager: Any, original: Callable[..., Any],
                      factory: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    observed: dict[str, dict[str, int]] = {}
    start = time.perf_counter()
    with keep_graphs():
        result = original(manager, observing(factory, observed, quiet=False), *args, **kwargs)
    captured = time.perf_counter() - start
    outputs = output_tensors(manager)
    if outputs is None:
        logger.error("foundry: the graph manager has no hidden_states buffer after capture; no archive is written")
        return result
    graphs = {graph_name(desc): (g, outputs) for desc, g in manager.graphs.items()}
    rt.adapter.state.update({
        "graphs": list(graphs),
        "outputs": {"hidden_states": 1, "aux_hidden_states": len(outputs) - 1},
    })
    if piecewise.enabled():
        try:
            pieces, state = piecewise.collect(_wrapper_instances())
        except UnsupportedError as exc:
            logger.error("foundry: the piecewise graphs are not saved: %s. The archive holds the FULL graphs only; "
                         "a LOAD of it captures as usual (with FOUNDRY_MODE=auto it saves again)", exc)
        else:
            graphs.update(pieces)
            rt.adapter.state[piecewise.STATE_KEY] = state
    if runtime.env_flag(runtime.CHECK_METADATA_ENV) and observed:
        rt.adapter.state["attention_addresses"] = observed
    start = time.perf_counter()
    report = rt.session.save(graphs)
    rt.saved = report is not None
    saved = f", saved in {time.perf_counter() - start:.2f} s" if report is not None else "; the archive was not saved"
    logger.info("foundry: captured %d graphs in %.2f s%s", len(graphs), captured, saved)
    return result


def _wrapper_instances() -> list[Any]:
    """Every CUDAGraphWrapper vLLM made (compiled pieces and others)."""
    return list(patching.resolve(seams.seam("piece.instances"))[2])


# ---- LOAD ----------------------------------------------------------------------------------------


def _check_restorable(rt: runtime.WorkerRuntime, manager: Any, archive: Any, original: Callable[..., Any],
                      factory: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    """Runs vLLM's capture loop with neutralised forwards (placeholders for every graph) and checks
    the archive against it. Returns (the loop's result, None) or (None, why it cannot be used)."""
    recorded = rt.recorded_adapter_state()
    by_name = {g.name: g for g in archive if not piecewise.is_piece(g.name)}
    expected = expected_names(manager)
    if expected is not None and set(expected) != set(by_name):
        missing = sorted(set(expected) - set(by_name))
        extra = sorted(set(by_name) - set(expected))
        return None, (f"vLLM wants {len(expected)} graphs, the archive holds {len(by_name)} (missing "
                      f"{missing[:3]}, unexpected {extra[:3]})")
    problem = _pieces_problem(manager, archive, recorded)
    if problem is not None:
        return None, problem
    layout = recorded.get("outputs", {}) if isinstance(recorded, Mapping) else {}
    want_aux = bool(getattr(manager, "use_aux_hidden_state_outputs", False))
    have_aux = int(layout.get("aux_hidden_states", 0) or 0) > 0 if isinstance(layout, Mapping) else False
    if want_aux != have_aux:
        return None, (f"vLLM {'wants' if want_aux else 'does not want'} auxiliary hidden states; the "
                      f"archive {'holds' if have_aux else 'does not hold'} them")

    observed: dict[str, dict[str, int]] = {}
    with neutralised(), numbered_dummy_requests():
        result = original(manager, observing(factory, observed, quiet=True), *args, **kwargs)
    missing = [graph_name(d) for d in manager.graphs if graph_name(d) not in by_name]
    if missing:
        return None, f"restored graphs cannot be used: the archive has no graph for {missing[:3]}"
    if runtime.env_flag(runtime.CHECK_METADATA_ENV):
        saved_addresses = recorded.get("attention_addresses") if isinstance(recorded, Mapping) else None
        if isinstance(saved_addresses, Mapping):
            problem = address_mismatch(saved_addresses, observed)
            if problem is not None:
                return None, f"restored graphs cannot be used: {problem}"
    return result, None


def _pieces_problem(manager: Any, archive: Any, recorded: Any) -> str | None:
    """Why the archive's piecewise graphs do not cover the PIECEWISE sizes vLLM wants (or None)."""
    wanted = piecewise.wanted_sizes(manager)
    state = recorded.get(piecewise.STATE_KEY) if isinstance(recorded, Mapping) else None
    have = sorted(state.get("sizes") or []) if isinstance(state, Mapping) else []
    pieces = sum(1 for g in archive if piecewise.is_piece(g.name))
    if wanted is None:
        return None if not pieces else "the archive holds piecewise graphs, vLLM captures none in this mode"
    if not piecewise.enabled():
        return f"vLLM wants piecewise graphs, which are off ({piecewise.disabled_reason()})"
    if wanted != have or not pieces:
        return (f"vLLM wants piecewise graphs for {len(wanted)} sizes, the archive holds {pieces} pieces for sizes "
                f"{have[:4]}...")
    return None


def _restore(rt: runtime.WorkerRuntime, manager: Any, original: Callable[..., Any],
             factory: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    instantiate, threads = modes.instantiate_mode()
    pieces_when = piecewise.instantiation()
    # Lazy and background mode instantiate every graph later anyway.
    defer = piecewise.is_piece if pieces_when != "restore" and instantiate in ("eager", "parallel") else None
    # Every rank answers exactly once, whatever happens here (ranks.py).
    try:
        restored = rt.load_archive(instantiate, threads, defer=defer)
        if restored is None:  # the session fell back already (and logged why)
            ranks.all_ranks(rt, False)
            return _FALLBACK
        archive, loaded = restored
        result, problem = _check_restorable(rt, manager, archive, original, factory, args, kwargs)
    except BaseException:
        ranks.all_ranks(rt, False)
        raise
    if not ranks.all_ranks(rt, problem is None) and problem is None:
        problem = "restored graphs cannot be used: another rank could not restore its graphs"
    if problem is not None:
        manager.graphs.clear()
        manager._graphs_captured = False
        rt.fall_back(MismatchError(problem))
        return _FALLBACK

    by_name = {g.name: g for g in archive}
    pieces = {name: g for name, g in by_name.items() if piecewise.is_piece(name)}
    if defer is not None and pieces_when == "background":
        archive.start_background()  # the pieces, while vLLM goes on; the FULL graphs are instantiated already
    if pieces:
        recorded = rt.recorded_adapter_state()
        rt.pieces = piecewise.Pieces(pieces, lambda name: archive.outputs(by_name[name].index),
                                     recorded.get(piecewise.STATE_KEY) or {})
    placeholders = list(manager.graphs)
    for desc in placeholders:
        manager.graphs[desc] = by_name[graph_name(desc)]
    if placeholders:
        outputs = archive.outputs(by_name[graph_name(placeholders[0])].index)
        outputs = tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,)
        manager.hidden_states = outputs[0]
        if len(outputs) > 1:
            manager.aux_hidden_states = list(outputs[1:])
    manager._foundry_archive = archive  # vLLM keeps only self.graphs; keep the outputs' owner too
    logger.info("foundry: restored %d graphs in %.2f s (instantiate=%s%s; %s) instead of capturing",
                len(placeholders) + len(pieces), loaded, instantiate,
                f", pieces {pieces_when}" if defer is not None else "", archive.times.breakdown())
    return result


# ---- the seams -----------------------------------------------------------------------------------


class _GcWithoutCollect:
    """``gc`` as ``capture_model`` sees it at LOAD: ``collect()`` does nothing, the rest is ``gc``'s."""

    def collect(self, *_args: Any, **_kwargs: Any) -> int:
        return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def without_gc_collect(function: Callable[..., Any]) -> contextlib.AbstractContextManager[None]:
    """LOAD: vLLM's ``capture_model`` starts with a full garbage collection, which frees memory for
    a real capture and costs a walk of the engine's whole heap; with no forward and no capture to
    make room for, it is skipped. Works on the module whose globals ``function`` reads ``gc``
    from; a no-op where that module has no ``gc``."""
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    if module is None or getattr(module, "gc", None) is not gc:
        return contextlib.nullcontext()
    return swapped(module, gc=_GcWithoutCollect())


def numbered_dummy_requests() -> contextlib.AbstractContextManager[None]:
    """LOAD: vLLM names each dummy request of each descriptor's input batch with a random UUID (one
    ``os.urandom`` call each; tens of thousands for the 8B shapes' 102 descriptors, 0.18 s of
    LOAD's graph step in a sampled profile). The names never leave the dummy batch, so LOAD's
    neutralised loop numbers them instead. A no-op where the seam is missing."""
    try:
        owner, name, _ = patching.resolve(seams.seam("runner.dummy_request_id"))
    except SeamError as exc:
        logger.debug("foundry: LOAD's capture loop keeps vLLM's random request ids (%s)", exc)
        return contextlib.nullcontext()
    numbers = itertools.count()
    return swapped(owner, **{name: lambda *_args, **_kwargs: f"{next(numbers):016x}"})


def wrap_capture_model(original: Callable[..., Any]) -> Callable[..., Any]:
    def capture_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None or rt.phase is not Phase.WARMUP or kwargs.get("profile_only"):
            return original(self, *args, **kwargs)
        rt.runner = self
        quiet = without_gc_collect(original) if rt.mode is Mode.LOAD else contextlib.nullcontext()
        with rt.in_phase(Phase.CAPTURE, Phase.WARMUP, "capture_model (capture or restore)"), quiet:
            workspace.warn_if_grown_outside(rt)
            return original(self, *args, **kwargs)

    return capture_model


def wrap_capture(original: Callable[..., Any]) -> Callable[..., Any]:
    def capture(self: Any, create_forward_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if (rt is None or rt.phase is not Phase.CAPTURE or rt.runner is None
                or getattr(rt.runner, "cudagraph_manager", None) is not self or not rt.region_open):
            return original(self, create_forward_fn, *args, **kwargs)
        rt.capture_seen = True
        modes.check_resolved_mode(getattr(self, "cudagraph_mode", None))
        with inference_mode():  # as vLLM's capture: restored outputs are inference tensors, like captured ones
            if rt.mode is Mode.LOAD:
                result = _restore(rt, self, original, create_forward_fn, args, kwargs)
                if result is not _FALLBACK:
                    return result
            if rt.mode is Mode.SAVE:
                return _capture_and_save(rt, self, original, create_forward_fn, args, kwargs)
        return original(self, create_forward_fn, *args, **kwargs)

    return capture


def wrap_piece_call(original: Callable[..., Any]) -> Callable[..., Any]:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is not None and rt.pieces is not None:
            entry_type, context, available = _piece_seams()
            if rt.pieces.prepare(self, args, entry_type, context() if available() else None) == piecewise.EAGER:
                return self.runnable(*args, **kwargs)
        return original(self, *args, **kwargs)

    return __call__


@functools.cache
def _piece_seams() -> tuple[type, Callable[[], Any], Callable[[], bool]]:
    """vLLM's CUDAGraphEntry, get_forward_context and is_forward_context_available, resolved once."""
    return tuple(patching.resolve(seams.seam(n))[2] for n in ("piece.entry", "piece.context", "piece.context_available"))


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "runner.capture_model": wrap_capture_model,
    "cg.capture": wrap_capture,
}
# A vLLM without these seams still runs the FULL graphs: the piecewise mode is then refused.
PIECE_SEAMS = tuple(s.name for s in seams.SEAMS if s.name.startswith("piece."))
PIECE_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "piece.call": wrap_piece_call,
}


def install() -> None:
    """Wraps the capture seams; SeamError names the first one missing in the installed vLLM."""
    for name, make in WRAPPERS.items():
        patching.install(name, make)
    if not piecewise.enabled():
        return
    try:
        for name in PIECE_SEAMS:  # all resolved now, so that a missing one refuses the mode before any start
            patching.resolve(seams.seam(name))
        for name, make in PIECE_WRAPPERS.items():
            patching.install(name, make)
        piecewise.mark_unavailable(None)
    except SeamError as exc:
        piecewise.mark_unavailable(str(exc))
        logger.warning("foundry: piecewise graphs cannot be restored with this vLLM (%s); FULL_AND_PIECEWISE is "
                       "refused, FULL_DECODE_ONLY works", exc)
