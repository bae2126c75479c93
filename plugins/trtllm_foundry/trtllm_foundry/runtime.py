"""The Foundry state of one TensorRT-LLM worker process: its EngineSession, its adapter, the
start-up phase it is in, and the capture loop the capture seam reports to.

A worker (an MPI-spawned process, or the ``LLM`` process itself with
``TLLM_WORKER_USE_SINGLE_PROCESS=1``) builds one model engine, so the state is process-global:
``start()`` creates it at ``PyTorchModelEngine.__init__``, ``current()`` returns it to the later
seams.

Phases: INIT (weights, first KV sizing) -> ESTIMATION (SAVE only: the KV-cache estimation pass,
run paused: its throwaway KV cache and executor, their warmup and graph captures and the
profiling run leave no trace in the region) -> FINAL (the final KV cache and executor) -> CAPTURE
(the final executor's warmup: autotuner, decode graphs) -> SERVING. The region is open from
``session.begin()`` until the capture phase ends. The pause machinery, ``timed`` and the life
cycle (begin, boundary, fall_back, finish) are :mod:`foundry_core.engine.worker`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from foundry_core.engine import EngineSession, NativeRegionRuntime, RegionRuntime, worker
from foundry_core.errors import InvalidArgumentError

from trtllm_foundry import options
from trtllm_foundry.adapter import TrtllmAdapter

logger = logging.getLogger("foundry.tensorrt_llm")

AUTOTUNER_CACHE_ENV = "TLLM_AUTOTUNER_CACHE_PATH"

# Logs how long the body took on this plugin's logger: one line per startup step.
timed = functools.partial(worker.timed, log=logger)

__all__ = ["Phase", "CaptureLoop", "WorkerRuntime", "DeviceOps", "current", "start", "reset", "timed",
           "region_runtime", "AUTOTUNER_CACHE_ENV"]


class Phase(enum.Enum):
    INIT = "init"
    ESTIMATION = "estimation"
    FINAL = "final"
    CAPTURE = "capture"
    SERVING = "serving"


@dataclasses.dataclass
class CaptureLoop:
    """One run of TensorRT-LLM's decode capture loop (``_run_cuda_graph_warmup``) driven by the
    plugin: the runner, and what the capture seam saw per graph name. SAVE fills ``captured``
    (:class:`trtllm_foundry.restore.Captured`); LOAD reads ``by_name`` (the archive's graphs) and
    ``recorded`` (SAVE's engine state) and lists the keys it installed in ``installed``."""

    runner: Any
    captured: dict[str, Any] = dataclasses.field(default_factory=dict)
    by_name: dict[str, Any] = dataclasses.field(default_factory=dict)
    recorded: dict[str, Any] = dataclasses.field(default_factory=dict)
    archive: Any = None
    installed: list[Any] = dataclasses.field(default_factory=list)


class DeviceOps(worker.DeviceOps):
    """The device operations the runtime needs (torch and libfoundry.so); a fake in unit tests."""

    logger: ClassVar[logging.Logger] = logger


def region_runtime() -> RegionRuntime:
    """The region operations of new sessions (libfoundry.so; the unit tests replace it)."""
    return NativeRegionRuntime()


class WorkerRuntime(worker.WorkerRuntime):
    """One worker's Foundry state; see the module docstring and
    :class:`foundry_core.engine.worker.WorkerRuntime`."""

    logger: ClassVar[logging.Logger] = logger
    no_capture_warning: ClassVar[str] = "TensorRT-LLM captured no decode CUDA graphs (capture seam not reached)"
    end_when_off_at_boundary: ClassVar[bool] = True

    def __init__(self, session: EngineSession, adapter: TrtllmAdapter, device: DeviceOps | None = None) -> None:
        super().__init__(session, adapter, device if device is not None else DeviceOps())
        self.phase = Phase.INIT
        self.loop: CaptureLoop | None = None
        self.restored = 0
        self._estimation: contextlib.ExitStack | None = None
        self.autotuner_cache: Path | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    def lazy_instantiation(self) -> bool:
        try:
            return options.instantiate_mode()[0] == "lazy"
        except InvalidArgumentError:
            return False  # the restore reports the setting

    # ---- cuBLAS workspaces ------------------------------------------------------------------------

    def create_blas_workspaces(self) -> None:
        """Both sides, right after the determinism boundary: PyTorch's cuBLAS handle and the
        workspace it keys by (handle, stream) are made now, in the region, for the current stream
        and for the stream ``torch.cuda.graph`` captures on (made here if it does not exist yet).

        Why: the first GEMMs of a TensorRT-LLM worker run in work SAVE pauses (the estimation pass,
        the autotuner and capture warmups), which would make these workspaces outside the region;
        captured GEMM kernels take the workspace pointer (cuBLAS split-K), which SAVE's pointer audit
        would refuse. Made here on both sides, they sit at the same address at SAVE and LOAD, like the
        weights."""
        import torch
        import torch.cuda.graphs

        graph_cls = torch.cuda.graphs.graph  # the class, also where a caller swapped torch.cuda.graph
        if getattr(graph_cls, "default_capture_stream", None) is None:
            graph_cls.default_capture_stream = torch.cuda.Stream()
        torch.cuda.current_blas_handle()
        with torch.cuda.stream(graph_cls.default_capture_stream):
            torch.cuda.current_blas_handle()

    # ---- the estimation pass (SAVE) ---------------------------------------------------------------

    def begin_estimation(self) -> None:
        """SAVE: the KV-cache estimation pass starts; it runs paused until :meth:`end_estimation`."""
        if self._estimation is not None:
            return
        self.phase = Phase.ESTIMATION
        self._estimation = contextlib.ExitStack()
        self._estimation.enter_context(timed("the KV-cache estimation pass (paused)"))
        self._estimation.enter_context(self.paused())

    def end_estimation(self) -> None:
        """The estimation pass is over (its managers torn down): the region resumes."""
        stack, self._estimation = self._estimation, None
        if stack is not None:
            stack.close()
        self.phase = Phase.FINAL

    # ---- the autotuner's cache file ----------------------------------------------------------------

    def scratch_dir(self) -> Path:
        """A private directory of this process, removed with the runtime."""
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="trtllm-foundry-")
        return Path(self._scratch.name)

    def use_autotuner_cache(self, environ: Any = None) -> Path:
        """Where TensorRT-LLM's autotuner keeps its cache in this process (TLLM_AUTOTUNER_CACHE_PATH:
        the user's, else one in :meth:`scratch_dir`, which this sets)."""
        env = os.environ if environ is None else environ
        if self.autotuner_cache is None:
            given = env.get(AUTOTUNER_CACHE_ENV, "").strip()
            if not given:
                given = str(self.scratch_dir() / "autotuner_cache.json")
                env[AUTOTUNER_CACHE_ENV] = given
            self.autotuner_cache = Path(given)
        return self.autotuner_cache


_SLOT: worker.RuntimeSlot[WorkerRuntime] = worker.RuntimeSlot()


def current() -> WorkerRuntime | None:
    """This process's worker runtime, or None (Foundry off, or no model engine built yet)."""
    return _SLOT.runtime


def start(llm_args: Any, rank: int, *, device: DeviceOps | None = None,
          adapter: TrtllmAdapter | None = None) -> WorkerRuntime | None:
    """Creates this process's runtime from FOUNDRY_ARCHIVE / FOUNDRY_MODE and begins the session
    (sets the region). Returns None when Foundry is off."""
    return _SLOT.keep(worker.start_runtime(
        rank, lambda: adapter if adapter is not None else TrtllmAdapter(llm_args),
        functools.partial(WorkerRuntime, device=device), session_factory=EngineSession, region=region_runtime))


def reset() -> None:
    """Forgets this process's runtime (tests)."""
    _SLOT.reset()
