"""The seams of the final executor's warmup: the autotuner, the decode capture loop, each capture.

``PyTorchModelEngine.warmup`` (TensorRT-LLM 1.2) runs the torch.compile warmup (refused), then
``_run_autotuner_warmup`` (one context forward under ``autotune(cache_path=$TLLM_AUTOTUNER_CACHE_PATH)``),
then ``_run_cuda_graph_warmup``, whose ``_capture_generation_cuda_graphs`` builds a dummy decode
batch per batch size (largest first) and calls ``forward``; ``forward`` builds the key's attention
metadata and inputs and calls ``CUDAGraphRunner.capture`` for a key it has no graph for, then
``replay``.

- **warmup** (the final executor's, not the estimation pass's): the capture phase; the region ends
  when it returns, on both sides.
- **autotuner** -- SAVE: the forward runs paused (``FOUNDRY_TRTLLM_WARMUP_FORWARDS``) and the cache
  file it writes is kept in the engine state; LOAD: the archived cache is written to a file and
  loaded into ``AutoTuner.get().profiling_cache`` (after ``setup_distributed_state``, as the warmup
  does), and the forward is skipped.
- **capture loop** -- SAVE: TensorRT-LLM's loop unchanged; each capture goes through
  :func:`trtllm_foundry.restore.capture_for_save` (Foundry's graph class, warmup forwards paused);
  after the loop every graph is saved with its outputs, output layout and input addresses. LOAD:
  the archive is restored first, then TensorRT-LLM's same loop runs with each capture replaced by
  :func:`trtllm_foundry.restore.install_restored`, after checking that the key is in the archive
  and that the graph's inputs (static tensors, attention metadata) are where they were at SAVE.
  TensorRT-LLM's ``replay`` right after each capture then replays the restored graph once on the
  dummy batch, as it replays the captured one at SAVE. A failed check stops the loop before the
  graph is installed, removes what was installed, and falls back: TensorRT-LLM's loop runs again
  and captures (auto mode writes a fresh archive).
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from foundry_core.engine import Mode
from foundry_core.errors import MismatchError

from trtllm_foundry import installing, modes, options, outputs, restore, runtime, seams
from trtllm_foundry.runtime import CaptureLoop, Phase

logger = logging.getLogger("foundry.tensorrt_llm")

AUTOTUNER_KEY = "autotuner_cache"
GRAPHS_KEY = "graphs"
LAYOUTS_KEY = "outputs"
ADDRESSES_KEY = "input_addresses"

__all__ = ["WRAPPERS", "install", "RestoreStopped", "wrap_warmup", "wrap_autotuner_warmup",
           "wrap_cuda_graph_warmup", "wrap_capture", "run_warmup_forward"]


class RestoreStopped(Exception):
    """LOAD's capture loop stopped before installing a graph that cannot be used (the reason)."""


def run_warmup_forward(rt: runtime.WorkerRuntime, what: str) -> Callable[[Callable[[], Any]], Any]:
    """How SAVE runs a warmup forward LOAD skips: paused, or in the region (FOUNDRY_TRTLLM_WARMUP_FORWARDS)."""
    paused = options.warmup_forwards() == "paused"

    def run(thunk: Callable[[], Any]) -> Any:
        if not paused:
            return thunk()
        with rt.paused():
            return thunk()

    run.__doc__ = f"runs {what}"
    return run


# ---- warmup --------------------------------------------------------------------------------------


def wrap_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    def warmup(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None or rt.phase not in (Phase.INIT, Phase.FINAL) or not rt.region_open:
            return original(self, *args, **kwargs)  # the estimation pass's warmup runs paused as it is
        with rt.in_phase(Phase.CAPTURE, Phase.SERVING, "the final warmup (autotuner, decode CUDA graphs)"):
            return original(self, *args, **kwargs)

    return warmup


# ---- autotuner -----------------------------------------------------------------------------------


def _autotuner() -> Any:
    module = importlib.import_module(seams.seam("autotuner.get").module)
    return module.AutoTuner.get()


def _load_autotuner_cache(rt: runtime.WorkerRuntime, engine: Any, cache: Any) -> None:
    path = rt.scratch_dir() / "autotuner_cache.load.json"
    path.write_text(json.dumps(cache))
    tuner = _autotuner()
    tuner.setup_distributed_state(engine.mapping, getattr(engine, "dist", None))
    tuner.profiling_cache.load_cache(str(path), int(getattr(engine.mapping, "rank", 0) or 0))


def _read_cache(rt: runtime.WorkerRuntime) -> Any:
    path = rt.use_autotuner_cache()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        logger.warning("foundry: the autotuner's cache %s cannot be read (%s); the archive carries none, so a LOAD "
                       "of it falls back to a normal start", path, exc)
        return None


def wrap_autotuner_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    def _run_autotuner_warmup(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        enabled = getattr(getattr(self, "llm_args", None), "enable_autotuner", True)
        if rt is None or rt.phase is not Phase.CAPTURE or not rt.region_open or not enabled:
            return original(self, *args, **kwargs)
        if rt.mode is Mode.LOAD:
            cache = rt.recorded_adapter_state().get(AUTOTUNER_KEY)
            if cache is None:
                rt.fall_back(MismatchError("the archive carries no autotuner cache"))
            else:
                _load_autotuner_cache(rt, self, cache)
                rt.skipped("the autotuner warmup forward (its cache comes from the archive)")
                return None
        if rt.mode is not Mode.SAVE:
            return original(self, *args, **kwargs)
        with runtime.timed("autotuner warmup"):
            result = run_warmup_forward(rt, "the autotuner's forward")(lambda: original(self, *args, **kwargs))
        rt.adapter.state[AUTOTUNER_KEY] = _read_cache(rt)
        return result

    return _run_autotuner_warmup


# ---- the capture loop ----------------------------------------------------------------------------


def _save_loop(rt: runtime.WorkerRuntime, engine: Any, original: Callable[..., Any], args: tuple,
               kwargs: dict) -> Any:
    loop = CaptureLoop(engine.cuda_graph_runner)
    rt.loop = loop
    rt.device.empty_cache()  # LOAD's restore empties PyTorch's cache where its loop starts: the same here
    start = time.perf_counter()
    result = original(engine, *args, **kwargs)
    captured_s = time.perf_counter() - start
    problems = [c.problem for c in loop.captured.values() if c.problem]
    if problems:
        logger.error("foundry: %s; no archive is written (TensorRT-LLM runs with its captured graphs, and the next "
                     "start captures again). Or %s", "; ".join(problems[:3]), modes.OFF_HINT)
        return result
    rt.adapter.state.update({
        GRAPHS_KEY: list(loop.captured),
        LAYOUTS_KEY: {name: c.layout for name, c in loop.captured.items()},
        ADDRESSES_KEY: {name: c.addresses for name, c in loop.captured.items()}})
    start = time.perf_counter()
    report = rt.session.save({name: (c.graph, c.tensors) for name, c in loop.captured.items()})
    rt.saved = report is not None
    what = f"saved to {rt.session.rank_dir} in {time.perf_counter() - start:.2f} s" if rt.saved else "not saved"
    logger.info("foundry: captured %d decode graphs in %.2f s, %s", len(loop.captured), captured_s, what)
    return result


def _restore_loop(rt: runtime.WorkerRuntime, engine: Any, original: Callable[..., Any], args: tuple,
                  kwargs: dict) -> tuple[bool, Any]:
    """LOAD: (True, result) when TensorRT-LLM's loop ran on restored graphs; (False, None) after a fallback."""
    instantiate, threads = options.instantiate_mode()
    loaded = rt.load_archive(instantiate, threads)
    if loaded is None:
        return False, None
    archive, load_s = loaded
    loop = CaptureLoop(engine.cuda_graph_runner, by_name={g.name: g for g in archive},
                       recorded=dict(rt.recorded_adapter_state()), archive=archive)
    rt.loop = loop
    start = time.perf_counter()
    try:
        result = original(engine, *args, **kwargs)
    except RestoreStopped as exc:
        restore.uninstall(loop.runner, loop.installed)
        rt.fall_back(MismatchError(f"restored graphs cannot be used: {exc}"))
        return False, None
    if not loop.installed:
        rt.fall_back(MismatchError("TensorRT-LLM's decode loop asked for no graph"))
        return False, None
    rt.restored = len(loop.installed)
    logger.info("foundry: restored %d decode graphs in %.2f s (instantiate=%s; %s) instead of capturing; "
                "TensorRT-LLM's loop without warmups or captures took %.2f s", len(loop.installed), load_s,
                instantiate, archive.times.breakdown(), time.perf_counter() - start)
    return True, result


def wrap_cuda_graph_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    def _run_cuda_graph_warmup(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime.current()
        if rt is None or rt.phase is not Phase.CAPTURE or rt.capture_seen or not rt.region_open:
            return original(self, *args, **kwargs)
        rt.capture_seen = True
        try:
            if rt.mode is Mode.LOAD:
                done, result = _restore_loop(rt, self, original, args, kwargs)
                if done:
                    return result
            if rt.mode is Mode.SAVE:
                return _save_loop(rt, self, original, args, kwargs)
            rt.loop = None
            return original(self, *args, **kwargs)
        finally:
            rt.loop = None

    return _run_cuda_graph_warmup


# ---- one capture -----------------------------------------------------------------------------------


def _install(rt: runtime.WorkerRuntime, loop: CaptureLoop, runner: Any, key: Any, initial_inputs: Any) -> None:
    name = restore.graph_name(key)
    restored = loop.by_name.get(name)
    if restored is None:
        raise RestoreStopped(f"the archive has no graph {name!r} (it holds {len(loop.by_name)})")
    if options.check_metadata():
        saved = loop.recorded.get(ADDRESSES_KEY, {}).get(name)
        if not isinstance(saved, dict):
            raise RestoreStopped(f"the archive records no input addresses for graph {name!r}")
        problem = restore.address_problem(name, saved, restore.watched_addresses(runner, initial_inputs))
        if problem is not None:
            raise RestoreStopped(problem)
    try:
        rebuilt = outputs.rebuild(loop.recorded.get(LAYOUTS_KEY, {}).get(name), loop.archive.outputs(restored.index))
    except MismatchError as exc:
        raise RestoreStopped(f"graph {name!r}: {exc}") from None
    restore.install_restored(runner, key, initial_inputs, restored, rebuilt)
    loop.installed.append(key)


def wrap_capture(original: Callable[..., Any]) -> Callable[..., Any]:
    def capture(self: Any, key: Any, forward_fn: Callable[..., Any], initial_inputs: Any, *args: Any,
                **kwargs: Any) -> Any:
        rt = runtime.current()
        loop = getattr(rt, "loop", None)
        if rt is None or loop is None or loop.runner is not self or not rt.region_open:
            return original(self, key, forward_fn, initial_inputs, *args, **kwargs)
        if rt.mode is Mode.LOAD:
            _install(rt, loop, self, key, initial_inputs)
            return None
        captured = restore.capture_for_save(
            self, key, forward_fn, initial_inputs,
            capture=lambda forward: original(self, key, forward, initial_inputs, *args, **kwargs),
            run_warmup=run_warmup_forward(rt, "a capture warmup forward"))
        loop.captured[captured.name] = captured
        return None

    return capture


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "engine.warmup": wrap_warmup,
    "engine.autotuner_warmup": wrap_autotuner_warmup,
    "engine.cuda_graph_warmup": wrap_cuda_graph_warmup,
    "runner.capture": wrap_capture,
}


def install(module: str | None = None) -> list[str]:
    """Wraps the warmup and capture seams (those of ``module`` when given)."""
    return installing.install_wrappers(WRAPPERS, module)
