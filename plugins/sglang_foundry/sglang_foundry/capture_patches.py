"""The CUDA-graph capture seams of SGLang's decode runner (0.5.17 ``model_executor/runner*``).

``ModelRunner.init_cuda_graphs`` marks the CAPTURE phase (eager runner and its kernel warmup,
prefill runner, decode capture) and ends the region when it returns, on both sides.
``DecodeCudaGraphRunner.capture`` is SGLang's decode loop: for each batch size, largest first,
``capture_one_shape`` prepares the static inputs and the attention metadata (outside the graph)
and calls ``FullCudaGraphBackend.capture_one``, which runs two eager warmup forwards, then captures
one forward into ``torch.cuda.CUDAGraph()`` under ``torch.cuda.graph(...)`` and stores the graph
and the forward's result in ``_graphs[key]`` / ``_outputs[key]`` (``replay`` reads both).

- **SAVE** runs SGLang's loop unchanged, except that ``torch.cuda.CUDAGraph`` names Foundry's graph
  class for the duration (a torch graph that keeps its ``CUgraph``) and the warmup forwards run
  paused (``FOUNDRY_SGLANG_WARMUP_FORWARDS``); then it saves every decode graph with the tensors of
  its output (the shared logits buffer slice), the output layout, the capture sizes and the
  attention-metadata addresses of each shape. Before the first shape's warmups it has PyTorch
  create the cuBLAS workspace of the capture stream in the region (``create_blas_workspace``).
- **LOAD** restores the archive first, then runs SGLang's same loop with the forwards replaced by
  no-ops (the warmups by the same cache flushes SAVE's pauses made) and ``torch.cuda.graph`` /
  ``torch.cuda.CUDAGraph`` neutralised: the per-shape preparation still runs, in SGLang's order, as
  at SAVE; the loop's two full garbage collections (``freeze_gc``) do not. Each placeholder in
  ``_graphs`` is then replaced by the restored graph of the same key (``.replay()``, and
  ``.reset()`` for 0.5.23's ``cleanup``), and ``_outputs[key]`` by the output rebuilt around the
  restored tensors; the backend keeps the archive alive.

Checks before a restored graph is used: the archive holds exactly the keys SGLang captures (sizes
compared before the loop), every CUDA tensor of each shape's attention metadata is where it was at
SAVE (``FOUNDRY_SGLANG_CHECK_METADATA=0`` turns this off), and the outputs rebuild. A failed check
falls back: SGLang captures normally (and auto mode writes a fresh archive).

The engine-agnostic pieces (``graph_name``, ``tensor_addresses``, ``address_mismatch``,
``swapped``, the graph placeholder, ``keep_graphs`` / ``neutralised``) are
:mod:`foundry_core.engine.capture`'s; this module adds SGLang's capture loop around them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from foundry_core.engine import Mode, capture, wait_triton_key
from foundry_core.engine.capture import MAX_DEPTH, address_mismatch, graph_name, swapped, tensor_addresses
from foundry_core.errors import MismatchError, UnsupportedError

from sglang_foundry import compile_stats, jit_caches, modes, options, outputs, patching, ranks, runtime, seams
from sglang_foundry.runtime import Phase

logger = logging.getLogger("foundry.sglang")

FALLBACK = object()  # what a restore returns when SGLang must capture after all
PREFILL_PREFIX = "bcg:"  # the archive's prefill graphs (prefill_patches), which the decode checks skip

__all__ = ["MAX_DEPTH", "CaptureLoop", "PendingGraph", "RestoredDecodeGraph", "WRAPPERS", "address_mismatch",
           "check_backend", "create_blas_workspace", "driven", "expected_names", "graph_name", "install",
           "keep_graphs", "loop_without_gc", "neutralised", "no_capture", "swapped", "tensor_addresses", "tracking",
           "wrap_capture_one", "wrap_decode_capture", "wrap_init_cuda_graphs"]


# ---- naming (pure; unit-tested) --------------------------------------------------------------------


def expected_names(runner: Any) -> list[str] | None:
    """The names of the keys SGLang's loop will capture, from the runner's own key functions
    (None when the runner does not say, or captures variants this check does not model)."""
    make_key = getattr(runner, "_make_graph_key", None)
    size_of = getattr(runner, "_capture_graph_size", None)
    sizes = getattr(runner, "capture_bs", None)
    if not callable(make_key) or not callable(size_of) or not sizes:
        return None
    if getattr(runner, "enable_pdmux", False) or getattr(runner, "record_nolora_graph", False):
        return None
    width = int(getattr(runner, "captured_req_width", 1) or 1)
    try:
        return [graph_name(make_key(size_of(bs=bs, num_tokens=bs * width))) for bs in sizes]
    except TypeError:
        return None


# ---- graph stand-ins -------------------------------------------------------------------------------


@dataclasses.dataclass
class CaptureLoop:
    """One run of SGLang's decode loop driven by the plugin: whether a capture context is open
    (warmup forwards run outside one), and the attention-metadata addresses seen per shape."""

    runner: Any
    capturing: bool = False
    warmups: int = 0
    observed: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    blas_ready: bool = False


def tracking(graph_context: Callable[..., Any], loop: CaptureLoop) -> Callable[..., Any]:
    """``torch.cuda.graph`` that marks ``loop`` as capturing while its block runs."""

    @contextlib.contextmanager
    def graph(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with graph_context(*args, **kwargs) as value:
            loop.capturing = True
            try:
                yield value
            finally:
                loop.capturing = False

    return graph


class PendingGraph(capture.PendingGraph):
    """What ``torch.cuda.CUDAGraph()`` returns during LOAD's neutralised loop; replaced by the
    restored graph before SGLang can replay it. ``reset()`` (0.5.23's ``cleanup``) does nothing."""

    plugin: ClassVar[str] = "sglang-foundry"

    def reset(self) -> None:
        pass


class RestoredDecodeGraph:
    """A restored graph in SGLang's graph table: ``replay()`` launches it on the current stream;
    ``reset()`` (0.5.23's ``cleanup``) does nothing, the archive owns the graph."""

    def __init__(self, restored: Any) -> None:
        self.restored = restored
        self.name = getattr(restored, "name", "")

    def replay(self, *args: Any, **kwargs: Any) -> None:
        self.restored.replay(*args, **kwargs)

    def reset(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"RestoredDecodeGraph({self.name!r})"


def no_capture(loop: CaptureLoop, empty_cache: Callable[[], None]) -> Callable[..., Any]:
    """What ``torch.cuda.graph(...)`` becomes during LOAD's neutralised loop: captures nothing, but
    empties PyTorch's cache on entry as ``torch.cuda.graph.__enter__`` does at SAVE, so the
    per-shape preparation that follows finds the same cache on both sides."""

    @contextlib.contextmanager
    def graph(*_args: Any, **_kwargs: Any) -> Iterator[None]:
        empty_cache()
        loop.capturing = True
        try:
            yield None
        finally:
            loop.capturing = False

    return graph


def keep_graphs(loop: CaptureLoop) -> contextlib.AbstractContextManager[None]:
    """SAVE: ``torch.cuda.CUDAGraph`` builds graphs that keep their CUgraph (foundry_core's), and
    ``torch.cuda.graph`` marks ``loop`` as capturing while its block runs."""
    import torch

    return capture.keep_graphs(graph=tracking(torch.cuda.graph, loop))


def neutralised(loop: CaptureLoop, empty_cache: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
    """LOAD: no graph is created or captured (``torch.cuda.graph`` empties the cache as at SAVE)."""
    return capture.neutralised(PendingGraph, no_capture(loop, empty_cache))


def create_blas_workspace() -> None:
    """SAVE, on the capture stream before the first warmup forward: PyTorch's cuBLAS handle and the
    workspace it keys by (handle, stream) are created now, in the region.

    Why: SGLang 0.5.17 runs the capture warmups on the stream it captures on (``graph_capture()``
    makes a new one), and those warmups are the process's first GEMMs. Run paused, they would
    create that workspace in the private pool, outside the region, and every captured GEMM kernel
    that takes the workspace pointer (cuBLAS split-K) would fail SAVE's pointer audit. Made here, it
    is a region block the graphs reference, which LOAD's restore maps like the graph memory, so
    LOAD needs no such call."""
    import torch

    torch.cuda.current_blas_handle()


def hold_graph_rng_state() -> Any:
    """Prefill loop, SAVE and LOAD alike, after the cuBLAS workspace: registers PyTorch's default
    CUDA generator with a graph that is never captured, and returns that graph (keep it for the
    process's life).

    Why: the generator allocates its graph-safe seed and offset (two 8-byte tensors) when the first
    graph registers with it, at SAVE the first segment's ``capture_begin``. They open a small-pool
    segment of the capture stream, and the static batches SGLang prepares for the later shapes fit
    in its free room. A LOAD captures nothing, so it would lack that segment and place a new one
    elsewhere. Registered here, the two tensors are allocated at the same point on both sides, and
    SAVE's captures find the generator registered already."""
    import torch

    holder = torch.cuda.CUDAGraph()
    holder.register_generator_state(torch.cuda.default_generators[torch.cuda.current_device()])
    return holder


def check_backend(backend: Any) -> None:
    """Refuses a decode backend other than FullCudaGraphBackend (or a platform subclass)."""
    module = importlib.import_module(seams.seam("cg.backend_init").module)
    if not isinstance(backend, module.FullCudaGraphBackend):
        raise modes.refuse(f"the decode CUDA-graph backend {type(backend).__name__} is not supported (supported: "
                           "FullCudaGraphBackend; pass --cuda-graph-backend-decode full)")


# ---- SAVE ----------------------------------------------------------------------------------------


def _capture_and_save(rt: runtime.SchedulerRuntime, runner: Any, original: Callable[..., Any],
                      args: tuple, kwargs: dict) -> Any:
    if rt.prefill_problem is not None:  # logged where it was found: the prefill graphs would be missing
        return original(runner, *args, **kwargs)
    loop = CaptureLoop(runner)
    rt.loop = loop
    # LOAD's load_graphs() empties PyTorch's cache where this loop starts: the same here.
    rt.device.empty_cache()
    start = time.perf_counter()
    with keep_graphs(loop):
        result = original(runner, *args, **kwargs)
    captured = time.perf_counter() - start
    backend = runner.backend
    graphs: dict[str, tuple[Any, Any]] = {}
    layouts: dict[str, Any] = {}
    for key, graph in backend._graphs.items():
        name = graph_name(key)
        try:
            tensors, layouts[name] = outputs.flatten(backend._outputs.get(key))
        except UnsupportedError as exc:
            logger.error("foundry: %s; no archive is written", exc)
            return result
        graphs[name] = (graph, tensors)
    rt.adapter.state.update(graphs=list(graphs), outputs=layouts,
                            capture_bs=[int(bs) for bs in getattr(runner, "capture_bs", [])])
    prefill = rt.prefill  # the prefill loop's graphs (prefill_patches.PrefillSave): one archive holds both
    if prefill is not None:
        rt.adapter.state["prefill"] = prefill.state
        graphs.update(prefill.graphs)
    if options.check_metadata() and loop.observed:
        rt.adapter.state["attention_addresses"] = loop.observed
    start = time.perf_counter()
    report = rt.session.save(graphs)
    rt.saved = report is not None
    if rt.saved:
        logger.info("foundry: captured %d decode graphs in %.2f s, saved %d graphs to %s in %.2f s", len(layouts),
                    captured, len(graphs), rt.session.rank_dir, time.perf_counter() - start)
    else:
        logger.info("foundry: captured %d decode graphs in %.2f s; the archive was not saved", len(layouts), captured)
    return result


# ---- LOAD ----------------------------------------------------------------------------------------


def _plan_problem(runner: Any, recorded: Mapping[str, Any], by_name: Mapping[str, Any]) -> str | None:
    """Why the archive cannot serve the loop SGLang is about to run (checked before the loop)."""
    saved_bs = recorded.get("capture_bs")
    now_bs = [int(bs) for bs in getattr(runner, "capture_bs", [])]
    if isinstance(saved_bs, list) and saved_bs != now_bs:
        return f"SGLang captures batch sizes {now_bs}, the archive was saved with {saved_bs}"
    expected = expected_names(runner)
    decode = {name for name in by_name if not name.startswith(PREFILL_PREFIX)}
    if expected is not None and set(expected) != decode:
        missing = sorted(set(expected) - decode)
        extra = sorted(decode - set(expected))
        return (f"SGLang wants {len(expected)} decode graphs, the archive holds {len(decode)} (missing {missing[:3]}, "
                f"unexpected {extra[:3]})")
    return None


def _restored_outputs(keys: list[Any], recorded: Mapping[str, Any], by_name: Mapping[str, Any],
                      archive: Any) -> dict[Any, Any]:
    """{key: output rebuilt around the restored tensors}; MismatchError when one cannot be."""
    layouts = recorded.get("outputs")
    if not isinstance(layouts, Mapping):
        raise MismatchError("the archive's engine state records no output layouts")
    out = {}
    for key in keys:
        name = graph_name(key)
        out[key] = outputs.rebuild(layouts.get(name), archive.outputs(by_name[name].index))
    return out


def _install_problem(loop: CaptureLoop, keys: list[Any], recorded: Mapping[str, Any],
                     by_name: Mapping[str, Any]) -> str | None:
    """Why the placeholders the loop left cannot take the restored graphs, or None."""
    missing = [graph_name(k) for k in keys if graph_name(k) not in by_name]
    if missing:
        return f"the archive has no graph for {missing[:3]}"
    if not keys:
        return "SGLang's decode loop captured nothing"
    saved_addresses = recorded.get("attention_addresses")
    if options.check_metadata() and isinstance(saved_addresses, Mapping):
        return address_mismatch(saved_addresses, loop.observed)
    return None


def _no_gc(enable_cudagraph_gc: bool) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


@contextlib.contextmanager
def loop_without_gc(seam_name: str = "cg.freeze_gc") -> Iterator[None]:
    """LOAD: SGLang's capture loop starts and ends with a full garbage collection (``freeze_gc``),
    which helps a real capture and costs a large heap's walk twice; with no forward and no
    capture in the loop it is skipped. ``seam_name`` names the runner module's ``freeze_gc``
    (decode by default); a no-op where that module has none."""
    module = sys.modules.get(seams.seam(seam_name).module)
    if module is None or not callable(getattr(module, "freeze_gc", None)):
        yield
        return
    with swapped(module, freeze_gc=_no_gc):
        yield


def _restore(rt: runtime.SchedulerRuntime, runner: Any, original: Callable[..., Any], args: tuple,
             kwargs: dict) -> Any:
    """The archive loaded, SGLang's decode loop without forwards, then the archive's graphs in its
    tables. Every rank answers two agreements (ranks.py), each once wherever it stops: before the
    loop, which meets the other ranks at a barrier per shape (all run it or none), and after it."""
    with ranks.Agreement(rt) as before_loop:
        recorded = rt.recorded_adapter_state()
        instantiate, threads = options.instantiate_mode()
        loaded_archive = rt.load_archive(instantiate, threads)  # None: the session fell back (and said why)
        by_name = {g.name: g for g in loaded_archive[0]} if loaded_archive is not None else {}
        problem = None if loaded_archive is None else _plan_problem(runner, recorded, by_name)
        if not before_loop.answer(loaded_archive is not None and problem is None):
            if loaded_archive is not None:
                rt.fall_back(MismatchError(problem or "another rank could not load its archive; every rank captures"))
            return FALLBACK
    assert loaded_archive is not None
    with ranks.Agreement(rt) as after_loop:
        return _restore_loop(rt, runner, original, args, kwargs, recorded, by_name, *loaded_archive, instantiate,
                             after_loop)


def _restore_loop(rt: runtime.SchedulerRuntime, runner: Any, original: Callable[..., Any], args: tuple,
                  kwargs: dict, recorded: Mapping[str, Any], by_name: Mapping[str, Any], archive: Any, loaded: float,
                  instantiate: str, agreement: ranks.Agreement) -> Any:

    loop = CaptureLoop(runner)
    rt.loop = loop
    wait_triton_key()  # the loop's attention metadata is its first Triton launch: no second hash beside the thread
    start = time.perf_counter()
    with neutralised(loop, rt.device.empty_cache), loop_without_gc():
        result = original(runner, *args, **kwargs)
    loop_s = time.perf_counter() - start
    start = time.perf_counter()
    backend = runner.backend
    keys = list(backend._graphs)
    problem = _install_problem(loop, keys, recorded, by_name)
    restored: dict[Any, Any] = {}
    if problem is None:
        try:
            restored = _restored_outputs(keys, recorded, by_name, archive)
        except MismatchError as exc:
            problem = str(exc)
    prefill = 0
    if problem is None and rt.prefill is not None:  # the prefill loop's placeholders (prefill_patches)
        try:
            prefill = rt.prefill.install(archive, by_name)
        except MismatchError as exc:
            problem = str(exc)
    if not agreement.answer(problem is None) and problem is None:
        problem = "another rank could not restore its graphs; every rank captures"  # the prefill graphs too
    if problem is not None:
        backend._graphs.clear()
        backend._outputs.clear()
        rt.fall_back(MismatchError(f"restored graphs cannot be used: {problem}"))
        return FALLBACK
    rt.prefill = None

    for key in keys:
        backend._graphs[key] = RestoredDecodeGraph(by_name[graph_name(key)])
        backend._outputs[key] = restored[key]
    backend._foundry_archive = archive  # SGLang keeps only the graph table; keep the outputs' owner too
    rt.restored = len(keys) + prefill
    shown = f" and {prefill} prefill graphs" if prefill else ""
    logger.info("foundry: restored %d decode graphs%s in %.2f s (instantiate=%s; %s) instead of capturing; SGLang's "
                "per-shape loop without forwards took %.2f s, installing the graphs and outputs %.2f s", len(keys),
                shown, loaded, instantiate, archive.times.breakdown(), loop_s, time.perf_counter() - start)
    return result


# ---- the seams -----------------------------------------------------------------------------------


def driven(rt: runtime.SchedulerRuntime, loop: CaptureLoop, forward_fn: Callable[[], Any]) -> Callable[[], Any]:
    """The forward ``capture_one`` runs: outside a capture context it is a warmup (SAVE: paused,
    or in the region; LOAD: the same cache flushes, nothing run), inside one it is the captured
    forward (SAVE: SGLang's; LOAD: nothing)."""
    paused = options.warmup_forwards() == "paused"

    def forward() -> Any:
        if loop.capturing:
            return None if rt.mode is Mode.LOAD else forward_fn()
        loop.warmups += 1
        if rt.mode is Mode.LOAD:
            if paused:
                rt.skipped("a capture warmup forward")
            return None
        if paused:
            with rt.paused():
                return forward_fn()
        return forward_fn()

    return forward


def wrap_capture_one(original: Callable[..., Any]) -> Callable[..., Any]:
    def capture_one(self: Any, shape_key: Any, forward_fn: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        loop = getattr(rt, "loop", None)
        if rt is None or loop is None or not rt.region_open or getattr(loop.runner, "backend", None) is not self:
            return original(self, shape_key, forward_fn, *args, **kwargs)
        if options.check_metadata():
            metadata = getattr(getattr(loop.runner, "attn_backend", None), "forward_metadata", None)
            loop.observed[graph_name(shape_key)] = tensor_addresses(metadata)
        if rt.mode is Mode.SAVE and not loop.blas_ready:
            loop.blas_ready = True
            create_blas_workspace()  # inside SGLang's graph_capture(): the current stream is the capture stream
        return original(self, shape_key, driven(rt, loop, forward_fn), *args, **kwargs)

    return capture_one


def wrap_decode_capture(original: Callable[..., Any]) -> Callable[..., Any]:
    def capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if (rt is None or rt.phase is not Phase.CAPTURE or rt.capture_seen or not rt.region_open
                or getattr(self, "model_runner", None) is not rt.runner):
            return original(self, *args, **kwargs)
        rt.capture_seen = True
        check_backend(getattr(self, "backend", None))
        try:
            if rt.mode is Mode.LOAD:
                result = _restore(rt, self, original, args, kwargs)
                if result is not FALLBACK:
                    return result
                _prefill_fell_back(rt)
            if rt.mode is Mode.SAVE:
                return _capture_and_save(rt, self, original, args, kwargs)
            return original(self, *args, **kwargs)
        finally:
            rt.loop = None

    return capture


def _prefill_fell_back(rt: runtime.SchedulerRuntime) -> None:
    """The decode restore fell back after the prefill loop stood in for a capture: SGLang captures
    the prefill graphs now. That loop placed SAVE's memory as a LOAD does, so no archive is
    written in this start (the next SAVE writes one)."""
    pending, rt.prefill = rt.prefill, None
    if pending is None:
        return
    pending.recapture()
    rt.prefill_problem = "the prefill graphs were placed for a restore that fell back"
    logger.warning("foundry: no archive is written in this start (%s); start once with --foundry-mode save to "
                   "write a new one", rt.prefill_problem)


def wrap_init_cuda_graphs(original: Callable[..., Any]) -> Callable[..., Any]:
    def init_cuda_graphs(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None or rt.phase is not Phase.INIT or getattr(self, "is_draft_worker", False):
            return original(self, *args, **kwargs)
        rt.runner = self
        if ranks.may_load(rt):  # the second agreement: a rank that fell back since the first captures
            ranks.agree(rt, True, "at the capture phase")
        jit_caches.placed()  # the first forward may load a JIT module: the archive's are in place first
        with rt.in_phase(Phase.CAPTURE, Phase.SERVING, "init_cuda_graphs (kernel warmup, decode capture or restore)"):
            result = original(self, *args, **kwargs)
        compile_stats.log_compile_stats(getattr(self, "server_args", None), "the capture phase")
        jit_caches.carried(rt)  # SAVE: what the capture compiled, then what the first requests add
        return result

    return init_cuda_graphs


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "capture.model": wrap_init_cuda_graphs,
    "cg.capture": wrap_decode_capture,
    "cg.capture_one": wrap_capture_one,
}


def install() -> None:
    """Wraps the capture seams; SeamError names the first one missing in the installed SGLang."""
    for name, make in WRAPPERS.items():
        patching.install(name, make)
