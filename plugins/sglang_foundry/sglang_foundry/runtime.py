"""The Foundry state of one SGLang scheduler process: its EngineSession, its adapter, the startup
phase it is in, and the region pauses SAVE uses for work LOAD does not repeat.

SGLang runs one scheduler (with one target model runner) per process, so the state is
process-global: ``start()`` creates it at the NCCL seam (``bootstrap._init_parallel_groups``),
``current()`` returns it to the later seams.

Phases: INIT (NCCL, weights, KV sizing and pools, attention backends) -> CAPTURE (inside
``ModelRunner.init_cuda_graphs``: eager runner and its kernel warmup, prefill capture, decode
capture) -> SERVING.
The region is open from ``session.begin()`` until the capture phase ends.

**Pauses.** SAVE runs the work LOAD skips (KV profiling, the kernel warmup, the capture warmup
forwards, the eager calls between prefill graph segments) *paused*, outside the region; LOAD
makes the same cache flushes with nothing in between (``skipped``). The pause machinery, ``timed`` and the life cycle (begin, boundary, fall_back,
finish) are engine-agnostic: :mod:`foundry_core.engine.worker`; this module adds SGLang's phases
and names.
"""

from __future__ import annotations

import enum
import functools
import logging
from typing import Any, ClassVar

from foundry_core.engine import EngineSession, NativeRegionRuntime, RegionRuntime, worker
from foundry_core.errors import InvalidArgumentError

from sglang_foundry import options
from sglang_foundry.adapter import SglangAdapter

logger = logging.getLogger("foundry.sglang")

# Logs how long the body took on this plugin's logger: one line per startup step.
timed = functools.partial(worker.timed, log=logger)


class Phase(enum.Enum):
    INIT = "init"
    CAPTURE = "capture"
    SERVING = "serving"


class DeviceOps(worker.DeviceOps):
    """The device operations the runtime needs (torch and libfoundry.so); a fake in unit tests.
    The region's log and claims serve the prefill loop (:mod:`sglang_foundry.prefill_patches`)."""

    logger: ClassVar[logging.Logger] = logger

    def log_position(self) -> int:
        """The region log's length: events from here on belong to the step that follows."""
        from foundry_core.region import allocation_log_size

        return allocation_log_size()

    def placements_since(self, first: int) -> list[tuple[int, str, int, int]]:
        """(log position, kind, offset, size) of the region's allocations and frees since log
        position ``first``."""
        from foundry_core.region import allocation_log

        return [(first + i, e.kind, e.offset, e.size) for i, e in enumerate(allocation_log(first))
                if e.kind in ("alloc", "free")]

    def claim(self, offset: int, size: int) -> None:
        """Makes ``[offset, offset+size)`` of the region live, as SAVE's allocation there was."""
        from foundry_core.region import claim_region

        claim_region(offset, size)

    def placement_divergence(self, saved_log: Any) -> str | None:
        """Where this process's region placements so far first differ from SAVE's log (claims of
        SAVE's blocks count as their allocations), with the events before it; None where they agree."""
        from foundry_core.graphs import read_saved_log
        from foundry_core.region import placement_divergence

        return placement_divergence(read_saved_log(saved_log))

    def tag(self, text: str) -> None:
        """Tags the region events from here on (a divergence names the step it happened in)."""
        from foundry_core.region import set_allocation_tag

        set_allocation_tag(text)

    def append_segments(self, path: str, label: str) -> None:
        """Appends PyTorch's cached segments (address, size, pool, and each block's size, state
        and, once :meth:`record_history` ran, where it was allocated) to ``path`` as one JSON line
        under ``label``."""
        import json

        import torch

        segments = [{"address": seg["address"], "size": seg["total_size"], "pool": str(seg.get("segment_pool_id")),
                     "blocks": [[b["size"], b["state"], _allocated_at(b)] for b in seg["blocks"]]}
                    for seg in torch.cuda.memory_snapshot()]
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"label": label, "segments": segments}) + "\n")

    def record_history(self) -> None:
        """Makes PyTorch record the Python stack of each allocation from here on (for the trace)."""
        import torch

        torch.cuda.memory._record_memory_history(stacks="python", max_entries=200_000)

    def region_layout(self) -> tuple[int, int]:
        """(cursor, live bytes) of the region: equal on both sides where SAVE and LOAD agree."""
        from foundry_core.region import region_info

        info = region_info()
        return info.cursor, info.live_bytes


def _allocated_at(block: dict[str, Any]) -> str:
    """The innermost SGLang or Foundry frame of a block's allocation stack ("" when unrecorded)."""
    for frame in block.get("frames") or []:
        name = str(frame.get("filename", ""))
        if "sglang" in name or "foundry" in name:
            return f"{name.rsplit('/', 1)[-1]}:{frame.get('line')} {frame.get('name')}"
    return ""


def region_runtime() -> RegionRuntime:
    """The region operations of new sessions (libfoundry.so; the unit tests replace it)."""
    return NativeRegionRuntime()


class SchedulerRuntime(worker.WorkerRuntime):
    """One scheduler's Foundry state; see the module docstring and
    :class:`foundry_core.engine.worker.WorkerRuntime`. A session that fell back to OFF at the
    determinism boundary ends the region there; "LOAD skips ..." lines are debug lines."""

    logger: ClassVar[logging.Logger] = logger
    skip_level: ClassVar[int] = logging.DEBUG
    no_capture_warning: ClassVar[str] = "SGLang captured no decode CUDA graphs (capture seam not reached)"
    end_when_off_at_boundary: ClassVar[bool] = True

    def __init__(self, session: EngineSession, adapter: SglangAdapter, device: DeviceOps | None = None) -> None:
        super().__init__(session, adapter, device if device is not None else DeviceOps())
        self.phase = Phase.INIT
        self.runner: Any = None            # the target ModelRunner, during the capture phase
        self.loop: Any = None              # the capture loop the capture seams drive (CaptureLoop)
        self.restored = 0
        # The prefill loop runs first: SAVE keeps its graphs for the decode loop's save (one
        # archive), or why they cannot be saved; LOAD installs them with the decode graphs.
        self.prefill: Any = None           # prefill_patches.PrefillSave / PrefillRestore
        self.prefill_problem: str | None = None
        self.graph_rng_state: Any = None   # holds the generator's graph-safe RNG state (prefill loop)

    def lazy_instantiation(self) -> bool:
        try:
            return options.instantiate_mode()[0] == "lazy"
        except InvalidArgumentError:
            return False  # the restore reports the setting


_SLOT: worker.RuntimeSlot[SchedulerRuntime] = worker.RuntimeSlot()


def current() -> SchedulerRuntime | None:
    """This process's scheduler runtime, or None (Foundry off, or no scheduler started yet)."""
    return _SLOT.runtime


def start(server_args: Any, rank: int, model_config: Any = None, *, device: DeviceOps | None = None,
          adapter: SglangAdapter | None = None) -> SchedulerRuntime | None:
    """Creates this process's runtime from FOUNDRY_ARCHIVE / FOUNDRY_MODE and begins the session
    (sets the region). Returns None when Foundry is off."""
    return _SLOT.keep(worker.start_runtime(
        rank, lambda: adapter if adapter is not None else SglangAdapter(server_args, model_config),
        functools.partial(SchedulerRuntime, device=device), session_factory=EngineSession, region=region_runtime))


def reset() -> None:
    """Forgets this process's runtime (tests)."""
    _SLOT.reset()


__all__ = ["Phase", "SchedulerRuntime", "DeviceOps", "current", "start", "reset", "timed", "region_runtime"]
