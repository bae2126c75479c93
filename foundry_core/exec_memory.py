"""LOAD: the driver's device memory for graph execs, grown ahead of the restore.

Each live ``CUgraphExec`` holds device memory of the driver's own (about 3.5 KB per node of a
decode graph on an H200), which the driver obtains while it instantiates: most of an
instantiation's cost when earlier execs stay alive, as a restore keeps them. The driver keeps
that memory when an exec is destroyed and hands it to later execs of any graph. :func:`warm`
instantiates and destroys stand-ins of the archive's graph sizes (chains of a no-op kernel), so a
thread can pay that growth while the engine loads its weights and the restore finds the memory
there (``csrc/graph/exec_warmup.h``).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from foundry_core import _native


@dataclass(frozen=True)
class ExecWarmup:
    graphs: int  # stand-ins asked for: one per archived graph
    execs: int  # stand-ins made and destroyed: fewer when stopped
    nodes: int  # nodes of the stand-ins made, all together
    seconds: float


def warm(payload: str | os.PathLike, stop: ctypes.c_int | None = None) -> ExecWarmup:
    """Instantiates and destroys one stand-in exec per graph of ``payload`` (an archive's
    ``graphs.fgr``), each as many nodes as that graph. Stops before the next stand-in once
    ``stop.value`` is non-zero (set from another thread). Needs the CUDA context only (made current
    on the calling thread when none is); raises FoundryError when the payload is unreadable or a
    driver call fails."""
    out = _native.ExecWarmup()
    _native.call("foundry_exec_memory_warm", os.fsencode(Path(payload)),
                 ctypes.byref(stop) if stop is not None else None, ctypes.byref(out))
    return ExecWarmup(out.graphs, out.execs, out.nodes, out.seconds)
