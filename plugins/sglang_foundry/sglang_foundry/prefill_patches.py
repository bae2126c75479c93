"""The CUDA-graph capture seams of SGLang's prefill runner with the ``breakable`` backend (the CUDA default).

SGLang builds the prefill runner before the decode runner, inside ``ModelRunner.init_cuda_graphs``.
``PrefillCudaGraphRunner.capture`` loops over the token counts, largest first; per count,
``capture_one_shape`` prepares the static batch and the attention metadata (outside any graph)
and calls ``BreakableCudaGraphBackend.capture_one``: two eager warmup forwards, the shared output
buffer (first shape only), then one forward under ``BreakableCUDAGraphCapture``, which captures
plain torch CUDA graphs (*segments*) and ends one wherever the forward reaches a function
decorated with ``eager_on_graph`` (attention): that function runs eagerly, the graph keeps a
closure that calls it again at replay, and a new segment begins (:mod:`sglang_foundry.breaks`).

- **SAVE** runs SGLang's loop with segments through Foundry's graph class (``torch.cuda.CUDAGraph``
  swapped, as for decode), the warmup forwards paused, and each eager call between two segments
  paused too (:class:`PausingCapture`): its temporaries stay out of the region, so the region
  sees only what LOAD can place again. Each shape's ``capture_one`` records the region blocks it
  allocated (the cuBLAS workspace, the shared output buffer, the graph pool's segments). The
  segments, their eager calls and outputs are kept for the decode loop's save
  (:class:`PrefillSave`): one archive holds the prefill and the decode graphs, named
  ``bcg:<shape>:<i>/<n>`` for the prefill ones.
- **LOAD** runs SGLang's same loop with each ``capture_one`` replaced by a stand-in: the cache
  flushes SAVE's pauses made, the cuBLAS workspace of the capture stream (first shape, made as
  at SAVE), and a *claim* of each other block that shape's ``capture_one`` allocated at SAVE, at
  its SAVE address (:func:`foundry_core.region.claim_region`), so the decode runner that follows
  places its buffers where it placed them at SAVE. The graph table gets placeholders; the archive
  itself is loaded at the decode loop, when every buffer its graphs read exists, and
  :meth:`PrefillRestore.install` then fills the prefill table with graphs rebuilt from the
  restored segments and eager calls.

Checks: the token counts before the loop; after it, every placement so far against SAVE's log
(a claim of SAVE's block counts as its allocation) and the region's cursor and live bytes; then
the decode restore's own checks. A failed check falls back: SGLang captures the prefill graphs
normally (:meth:`PrefillRestore.recapture` when the decode restore fails after the loop).

Both sides begin the first shape alike: the capture stream's cuBLAS workspace, then the default
CUDA generator registered with a graph that is never captured
(:func:`sglang_foundry.capture_patches.hold_graph_rng_state`), so the small cached segment its
graph-safe RNG state opens exists at LOAD too. On by default; ``FOUNDRY_SGLANG_PREFILL_GRAPHS=0``
refuses these graphs (:mod:`sglang_foundry.modes`). H200 evidence: docs/engine-sglang.md, section 6.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from foundry_core.engine import Mode
from foundry_core.engine.capture import graph_name, is_cuda_tensor, swapped
from foundry_core.errors import FoundryError, MismatchError, UnsupportedError
from foundry_core.graphs import LOG_NAME

from sglang_foundry import breaks, capture_patches, modes, options, outputs, patching, ranks, runtime, seams

logger = logging.getLogger("foundry.sglang")

PREFIX = capture_patches.PREFILL_PREFIX
WARMUPS = 2  # the eager warmup forwards capture_one runs before each capture

__all__ = ["PREFIX", "PausingCapture", "PrefillLoop", "PrefillRestore", "PrefillSave", "WRAPPERS",
           "check_backend", "collect", "install", "is_prefill_graph", "pausing", "segment_name", "window_claims"]


# ---- naming (pure) ---------------------------------------------------------------------------------


def segment_name(shape: str, index: int, count: int) -> str:
    """The archive's name for segment ``index`` of ``count`` of the prefill graph of ``shape``."""
    return f"{PREFIX}{shape}:{index}/{count}"


def is_prefill_graph(name: str) -> bool:
    return name.startswith(PREFIX)


# ---- the loop's state ----------------------------------------------------------------------------


@dataclasses.dataclass
class PrefillLoop(capture_patches.CaptureLoop):
    """One run of SGLang's prefill loop driven by the plugin. SAVE: the log position where the loop
    began and, per shape, the log positions its ``capture_one`` spanned (``windows``). LOAD: the
    recorded shapes."""

    first_event: int = 0
    windows: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    recorded: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PrefillSave:
    """SAVE: the prefill graphs for the decode loop's save (``{name: (segment, tensors)}``) and
    their record in the engine state."""

    graphs: dict[str, tuple[Any, Any]]
    state: dict[str, Any]


@dataclasses.dataclass
class PrefillRestore:
    """LOAD: the prefill runner whose placeholders the decode restore replaces (:meth:`install`),
    its recorded shapes, and SGLang's capture for a fallback after the loop (:meth:`recapture`)."""

    runner: Any
    recorded: Mapping[str, Any]
    capture: Callable[..., Any]

    def install(self, archive: Any, by_name: Mapping[str, Any]) -> int:
        """Fills the prefill runner's table with graphs rebuilt from the archive's segments and
        eager calls; returns how many. MismatchError when one cannot be rebuilt (then nothing is
        installed)."""
        bcg = importlib.import_module(seams.seam("bcg.graph").module)
        backend = self.runner.backend
        built = {key: _rebuilt(bcg, graph_name(key), self.recorded, archive, by_name) for key in backend._graphs}
        for key, (graph, output) in built.items():
            backend._graphs[key] = graph
            backend._outputs[key] = output
        backend._foundry_archive = archive  # SGLang keeps only the tables; keep the outputs' owner too
        return len(built)

    def recapture(self) -> None:
        """The restore fell back after the prefill loop stood in: SGLang captures the prefill
        graphs now (no archive is written in this start)."""
        _clear(self.runner.backend)
        logger.warning("foundry: the restore fell back after the prefill loop; SGLang captures the prefill graphs now")
        self.capture(self.runner)


# ---- SAVE: the eager calls between segments run paused ---------------------------------------------


class PausingCapture:
    """Mixed into SGLang's ``BreakableCUDAGraphCapture`` at SAVE (:func:`pausing`): from the end
    of one segment to the beginning of the next, the eager call runs paused (outside the region,
    in a pool of its own); the loop is marked capturing from enter to exit, which tells the warmup
    forwards from the captured one."""

    foundry_runtime: ClassVar[Any] = None
    foundry_loop: ClassVar[Any] = None
    _foundry_pause: contextlib.ExitStack | None = None
    _foundry_exiting = False

    def __enter__(self) -> Any:
        value = super().__enter__()  # type: ignore[misc]
        self.foundry_loop.capturing = True
        return value

    def _end_current_segment(self) -> None:
        super()._end_current_segment()  # type: ignore[misc]
        if not self._foundry_exiting:
            self._foundry_pause = contextlib.ExitStack()
            self._foundry_pause.enter_context(self.foundry_runtime.paused())

    def _begin_new_segment(self) -> None:
        self._foundry_resume()
        super()._begin_new_segment()  # type: ignore[misc]

    def _foundry_resume(self) -> None:
        pause, self._foundry_pause = self._foundry_pause, None
        if pause is not None:
            pause.close()

    def __exit__(self, *exc: object) -> Any:
        self._foundry_exiting = True
        try:
            return super().__exit__(*exc)  # type: ignore[misc]
        finally:
            self._foundry_resume()
            self.foundry_loop.capturing = False


def pausing(base: type, rt: Any, loop: PrefillLoop) -> type:
    """``base`` (SGLang's capture class) with :class:`PausingCapture` mixed in, bound to ``rt``."""
    return type(base.__name__, (PausingCapture, base), {"foundry_runtime": rt, "foundry_loop": loop})


def _backend_module() -> Any:
    return importlib.import_module(seams.seam("bcg.capture_one").module)


def check_backend(backend: Any) -> None:
    """Refuses a prefill backend other than BreakableCudaGraphBackend."""
    module = _backend_module()
    if not isinstance(backend, module.BreakableCudaGraphBackend):
        raise modes.refuse(f"the prefill CUDA-graph backend {type(backend).__name__} is not supported (supported: "
                           f"{modes.PREFILL_BACKEND!r}, or {modes.PREFILL_FLAG})")


# ---- SAVE: what the archive keeps --------------------------------------------------------------------


def window_claims(windows: Mapping[str, tuple[int, int]],
                  events: list[tuple[int, str, int, int]]) -> dict[str, list[list[int]]]:
    """Per shape, the ``[offset, size]`` of each region block its ``capture_one`` allocated (its
    window of log positions, ``[start, end)``), in order; ``events`` are the loop's allocations and
    frees, (position, kind, offset, size). UnsupportedError when such a block was freed again
    before the loop ended: LOAD places these blocks by claiming them, and a claim is never freed."""
    claims: dict[str, list[list[int]]] = {shape: [] for shape in windows}
    live: dict[int, str] = {}  # offset -> the shape whose window allocated it
    for position, kind, offset, size in events:
        if kind == "free" and offset in live:
            raise UnsupportedError(f"the prefill capture of {live[offset]} allocated region memory (offset "
                                   f"{offset:#x}) that was freed again before the loop ended; LOAD could not place "
                                   "it alike")
        shape = next((s for s, (start, end) in windows.items() if start <= position < end), None)
        if kind == "alloc" and shape is not None:
            claims[shape].append([offset, size])
            live[offset] = shape
    return claims


def _decorated() -> dict[int, str]:
    sglang_modules = [(n, m) for n, m in list(sys.modules.items()) if n.startswith("sglang.") and m is not None]
    return breaks.decorated_index(sglang_modules)


def collect(backend: Any, claims: Mapping[str, list[list[int]]], index: Mapping[int, str]) -> PrefillSave:
    """The archive's prefill graphs and their record, from the backend SGLang's loop filled.
    UnsupportedError naming what cannot be kept."""
    graphs: dict[str, tuple[Any, Any]] = {}
    shapes: dict[str, Any] = {}
    for key, graph in backend._graphs.items():
        shape = graph_name(key)
        segments, calls = list(graph._segments), list(graph._break_fns)
        if len(calls) != len(segments) - 1:
            raise UnsupportedError(f"the prefill graph of {shape} has {len(segments)} segments and {len(calls)} eager "
                                   "calls; expected one call between each two segments")
        records = []
        for i, call in enumerate(calls):
            tensors: list[Any] = []
            records.append(breaks.describe(call, index, is_cuda_tensor, tensors))
            graphs[segment_name(shape, i, len(segments))] = (segments[i], tuple(tensors))
        last, layout = outputs.flatten(backend._outputs.get(key))
        graphs[segment_name(shape, len(segments) - 1, len(segments))] = (segments[-1], last)
        shapes[shape] = {"segments": len(segments), "breaks": records, "output": layout,
                         "claims": list(claims.get(shape, []))}
    return PrefillSave(graphs, {"backend": modes.PREFILL_BACKEND, "shapes": shapes})


def _capture_and_keep(rt: runtime.SchedulerRuntime, runner: Any, original: Callable[..., Any]) -> Any:
    loop = PrefillLoop(runner)
    rt.loop = loop
    rt.device.empty_cache()  # LOAD's loop starts with the same flush
    _start_trace(rt)
    loop.first_event = rt.device.log_position()
    module = _backend_module()
    start = time.perf_counter()
    with capture_patches.keep_graphs(loop), swapped(module, BreakableCUDAGraphCapture=pausing(
            module.BreakableCUDAGraphCapture, rt, loop)):
        result = original(runner)
    rt.device.tag("")  # what follows is no longer the prefill loop's
    captured = time.perf_counter() - start
    try:
        claims = window_claims(loop.windows, rt.device.placements_since(loop.first_event))
        saved = collect(runner.backend, claims, _decorated())
    except UnsupportedError as exc:
        rt.prefill_problem = str(exc)
        logger.error("foundry: %s; no archive is written (pass %s to save the decode graphs alone)", exc,
                     modes.PREFILL_FLAG)
        return result
    saved.state["tokens"] = [int(n) for n in getattr(runner, "capture_num_tokens", [])]
    saved.state["region"] = list(rt.device.region_layout())
    rt.prefill = saved
    logger.info("foundry: captured %d prefill graphs (%d segments) in %.2f s; they are saved with the decode graphs",
                len(saved.state["shapes"]), len(saved.graphs), captured)
    return result


# ---- SAVE and LOAD alike ------------------------------------------------------------------------


def _capture_stream_state(rt: runtime.SchedulerRuntime, loop: PrefillLoop) -> None:
    """First shape, SAVE and LOAD alike (the current stream is the prefill capture stream): the
    cuBLAS workspace and the generator's graph-safe RNG state, made by PyTorch in the same order on
    both sides. PyTorch's cache must hold their blocks on both sides, or the small allocations SAVE
    placed beside them would need a new block at LOAD."""
    if loop.blas_ready:
        return
    loop.blas_ready = True
    capture_patches.create_blas_workspace()
    rt.graph_rng_state = capture_patches.hold_graph_rng_state()


# ---- LOAD ----------------------------------------------------------------------------------------


def _plan_problem(runner: Any, recorded: Any) -> str | None:
    """Why the archive's record cannot stand in for the prefill loop SGLang is about to run."""
    if not isinstance(recorded, Mapping) or not isinstance(recorded.get("shapes"), Mapping):
        return "the archive holds no prefill graphs (saved with prefill CUDA graphs off)"
    now = [int(n) for n in getattr(runner, "capture_num_tokens", [])]
    saved = recorded.get("tokens")
    if saved != now:
        return (f"SGLang captures prefill graphs for {len(now)} token counts (up to {max(now, default=0)}), the archive "
                f"for {len(saved) if isinstance(saved, list) else saved!r}")
    return None


def _stand_in(rt: runtime.SchedulerRuntime, loop: PrefillLoop, backend: Any, shape_key: Any,
              capture_inputs: Any) -> None:
    """LOAD's ``capture_one``: SAVE's flushes and placements for this shape, a placeholder graph."""
    shape = graph_name(shape_key)
    record = loop.recorded.get(shape)
    if not isinstance(record, Mapping):
        raise MismatchError(f"the archive holds no prefill graph for {shape}")
    rt.device.tag(f"prefill capture {shape}")
    _capture_stream_state(rt, loop)
    if options.warmup_forwards() == "paused":
        for _ in range(WARMUPS):
            rt.skipped("a prefill capture warmup forward")
    for offset, size in record.get("claims", []):
        rt.device.claim(int(offset), int(size))
    if record.get("breaks"):
        rt.skipped("the eager calls between a prefill graph's segments")
    backend._graphs[shape_key] = capture_patches.PendingGraph()
    backend._outputs[shape_key] = None
    backend._capture_inputs[shape_key] = capture_inputs
    _trace(rt, f"load {shape}")
    rt.device.tag(f"prefill prepare after {shape}")


def _start_trace(rt: runtime.SchedulerRuntime) -> None:
    if options.prefill_trace() is not None:
        rt.device.record_history()


def _trace(rt: runtime.SchedulerRuntime, label: str) -> None:
    """With FOUNDRY_SGLANG_PREFILL_TRACE set: PyTorch's cached segments at the end of a shape."""
    path = options.prefill_trace()
    if path is not None:
        rt.device.append_segments(path, label)


def _clear(backend: Any) -> None:
    for table in ("_graphs", "_outputs", "_capture_inputs"):
        getattr(backend, table).clear()


def _stand_in_loop(rt: runtime.SchedulerRuntime, runner: Any, original: Callable[..., Any]) -> Any:
    """SGLang's prefill loop placing SAVE's memory without forwards; every rank answers the third
    agreement (ranks.py) once, wherever it stops."""
    with ranks.Agreement(rt) as agreement:
        return _stand_in_agreed(rt, runner, original, agreement)


def _stand_in_agreed(rt: runtime.SchedulerRuntime, runner: Any, original: Callable[..., Any],
                     agreement: ranks.Agreement) -> Any:
    recorded = rt.recorded_adapter_state().get("prefill")
    problem = _plan_problem(runner, recorded)
    if problem is not None:
        agreement.answer(False)
        rt.fall_back(MismatchError(problem))
        return capture_patches.FALLBACK
    loop = PrefillLoop(runner, recorded=recorded["shapes"])
    rt.loop = loop
    rt.device.empty_cache()
    _start_trace(rt)
    start = time.perf_counter()
    try:
        with capture_patches.loop_without_gc("pcg.freeze_gc"):
            result = original(runner)
        rt.device.tag("")
        diverged = rt.device.placement_divergence(rt.session.rank_dir / LOG_NAME)
        if diverged is not None:
            raise MismatchError(f"the prefill loop placed memory elsewhere than at SAVE ({diverged})")
        layout = list(rt.device.region_layout())
        if layout != recorded.get("region"):
            raise MismatchError(f"after the prefill loop the region's cursor and live bytes are {layout}, at SAVE "
                                f"{recorded.get('region')}")
    except FoundryError as exc:
        agreement.answer(False)
        problem = (f"the prefill graphs cannot be placed: {exc} (an archive saved with {modes.PREFILL_FLAG} restores "
                   "the decode graphs)")
    else:
        problem = None if agreement.answer(True) else ("another rank could not place its prefill graphs; every rank "
                                                       "captures")
    if problem is not None:
        _clear(runner.backend)
        # Blocks may be claimed already: an archive saved in this start would not match a LOAD.
        rt.prefill_problem = problem
        rt.fall_back(MismatchError(rt.prefill_problem))
        return capture_patches.FALLBACK
    rt.prefill = PrefillRestore(runner, recorded, original)
    logger.info("foundry: SGLang's prefill loop ran without forwards or captures in %.2f s (%d shapes placed as at "
                "SAVE); its graphs are installed with the decode graphs", time.perf_counter() - start,
                len(runner.backend._graphs))
    return result


def _rebuilt(bcg: Any, shape: str, recorded: Mapping[str, Any], archive: Any,
             by_name: Mapping[str, Any]) -> tuple[Any, Any]:
    record = recorded["shapes"].get(shape)
    if not isinstance(record, Mapping):
        raise MismatchError(f"the archive records no prefill graph for {shape}")
    count = int(record.get("segments", 0))
    names = [segment_name(shape, i, count) for i in range(count)]
    missing = [n for n in names if n not in by_name]
    calls = record.get("breaks", [])
    if missing or count < 1 or len(calls) != count - 1:
        raise MismatchError(f"the archive's prefill graph {shape} is incomplete (missing {missing[:3]})")
    graph = bcg.BreakableCUDAGraph()
    graph._segments = [capture_patches.RestoredDecodeGraph(by_name[n]) for n in names]
    graph._break_fns = [breaks.rebuild(call, archive.outputs(by_name[names[i]].index), bcg._copy_output)
                        for i, call in enumerate(calls)]
    output = outputs.rebuild(record.get("output"), archive.outputs(by_name[names[-1]].index))
    return graph, output


# ---- the seams -----------------------------------------------------------------------------------


def _driving(rt: Any, backend: Any) -> PrefillLoop | None:
    loop = getattr(rt, "loop", None)
    if rt is None or not isinstance(loop, PrefillLoop) or not rt.region_open:
        return None
    return loop if getattr(loop.runner, "backend", None) is backend else None


def wrap_capture_one(original: Callable[..., Any]) -> Callable[..., Any]:
    def capture_one(self: Any, shape_key: Any, forward_fn: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        loop = _driving(rt, self)
        if loop is None:
            return original(self, shape_key, forward_fn, *args, **kwargs)
        if rt.mode is Mode.LOAD:
            return _stand_in(rt, loop, self, shape_key, kwargs.get("capture_inputs", args[0] if args else None))
        rt.device.tag(f"prefill capture {graph_name(shape_key)}")
        first = rt.device.log_position()
        _capture_stream_state(rt, loop)
        result = original(self, shape_key, capture_patches.driven(rt, loop, forward_fn), *args, **kwargs)
        loop.windows[graph_name(shape_key)] = (first, rt.device.log_position())
        _trace(rt, f"save {graph_name(shape_key)}")
        rt.device.tag(f"prefill prepare after {graph_name(shape_key)}")
        return result

    return capture_one


def wrap_prefill_capture(original: Callable[..., Any]) -> Callable[..., Any]:
    def capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if (rt is None or rt.phase is not runtime.Phase.CAPTURE or not rt.region_open
                or getattr(self, "model_runner", None) is not rt.runner or rt.prefill is not None):
            return original(self, *args, **kwargs)
        check_backend(getattr(self, "backend", None))
        try:
            if rt.mode is Mode.LOAD:
                result = _stand_in_loop(rt, self, original)
                if result is not capture_patches.FALLBACK:
                    return result
            if rt.mode is Mode.SAVE:
                return _capture_and_keep(rt, self, original)
            return original(self, *args, **kwargs)
        finally:
            rt.loop = None

    return capture


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "pcg.capture": wrap_prefill_capture,
    "bcg.capture_one": wrap_capture_one,
}


def install() -> None:
    """Wraps the prefill capture seams; SeamError names the first one missing in the installed SGLang."""
    for name, make in WRAPPERS.items():
        patching.install(name, make)

