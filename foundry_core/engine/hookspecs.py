"""The hooks an engine adapter implements (pluggy, project name ``foundry``).

An adapter is a module or an object whose ``foundry_*`` functions answer these hooks; decorating
them with :data:`hookimpl` is optional (it lets an adapter set ``tryfirst`` and friends). Hooks
marked *firstresult* take the first non-None answer; the others collect every adapter's answer.

Required: foundry_engine_identity, foundry_model_identity, foundry_capture_sizes,
foundry_parallel_config. foundry_record_state is required to SAVE. The rest are optional.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from foundry_core.engine.fingerprint import ParallelConfig
    from foundry_core.engine.mode import Mode

PROJECT = "foundry"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

REQUIRED_HOOKS = ("foundry_engine_identity", "foundry_model_identity", "foundry_capture_sizes",
                  "foundry_parallel_config")


@hookspec(firstresult=True)
def foundry_engine_identity() -> tuple[str, str] | None:
    """The engine's ``(name, version)``, e.g. ``("vllm", "0.33.0")``; part of the fingerprint and
    of engine.json."""


@hookspec(firstresult=True)
def foundry_model_identity() -> Mapping[str, Any] | None:
    """A JSON-able dict that identifies the model and every engine setting that shapes the captured
    graphs (model config, quantization, attention backend, ...). Foundry hashes it (sha256 of the
    canonical JSON, key order irrelevant): any change means a fresh SAVE."""


@hookspec(firstresult=True)
def foundry_capture_sizes() -> Sequence[int] | None:
    """The batch sizes the engine captures graphs for, in capture order."""


@hookspec(firstresult=True)
def foundry_parallel_config() -> ParallelConfig | Mapping[str, int] | None:
    """The parallel sizes: a ParallelConfig or a dict with keys among tp, pp, dp, ep, world_size
    (world_size = number of ranks holding an archive; default tp * pp * dp)."""


@hookspec(firstresult=True)
def foundry_dtype() -> Any:
    """The model's compute dtype (a string or a torch.dtype); optional, part of the fingerprint."""


@hookspec
def foundry_graph_knobs() -> Mapping[str, Any]:
    """Settings that change the captured graphs but are not in the model identity (CUDA-graph mode,
    attention backend flags, ...), as ``{name: JSON-able value}``. Every adapter's knobs are
    merged; two adapters giving one knob different values is an error."""


@hookspec(firstresult=True)
def foundry_record_state() -> Mapping[str, Any] | None:
    """At SAVE, after capture: ``{"kv_cache_bytes": int, "kv_cache_blocks": int, ...}``. Every
    other key is kept for the adapter in engine_state.json (EngineState.adapter) and handed back
    at LOAD through EngineSession.recorded_state()."""


@hookspec
def foundry_on_fallback(reason: str, mode: Mode) -> None:
    """The archive is not used: ``reason`` says why, ``mode`` is the mode the engine continues in
    (SAVE: it captures and writes a fresh archive; OFF: it captures without writing). The engine
    must now start normally (warmup, profiling, capture). Called on every adapter."""
