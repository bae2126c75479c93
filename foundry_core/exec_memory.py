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
    execs: int  # stand-in execs made and destroyed: one per archived graph
    nodes: int  # their nodes, all together
    seconds: float


def warm(payload: str | os.PathLike) -> ExecWarmup:
    """Instantiates and destroys one stand-in exec per graph of ``payload`` (an archive's
    ``graphs.fgr``), each as many nodes as that graph. Needs the CUDA context only (made current
    on the calling thread when none is); raises FoundryError when the payload is unreadable or a
    driver call fails."""
    execs, nodes, seconds = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_double()
    _native.call("foundry_exec_memory_warm", os.fsencode(Path(payload)), ctypes.byref(execs), ctypes.byref(nodes),
                 ctypes.byref(seconds))
    return ExecWarmup(execs.value, nodes.value, seconds.value)
