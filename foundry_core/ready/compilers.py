"""The compilers a start ran: a LOAD on empty caches is meant to answer its first request without
compiling, and a compiler process is the direct sign that it did not.

What compiles on an engine's first use runs as child processes: nvcc and its stages (cicc, ptxas,
fatbinary, nvlink, cudafe++) for FlashInfer's and tvm-ffi's JIT modules under ninja, ptxas for
every Triton kernel (Triton assembles its PTX with it), gcc for Triton's launchers and Inductor's
C++ wrappers. :class:`CompilerWatch` looks at the server's process group a few times a second and
keeps each compiler command it sees. A compile inside the process (the CUDA driver's PTX JIT) runs
no process; a cold start's cache inventory (``caches.inventory``: ``CUDA_CACHE_PATH``) shows that.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from foundry_core.ready.server import process_stat

__all__ = ["COMPILERS", "CompilerWatch"]

COMPILERS = frozenset({"nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "ninja", "cc1", "cc1plus",
                       "gcc", "g++", "cc", "c++", "clang", "clang++"})
INTERVAL_S = 0.2  # a compile worth finding takes longer; five looks a second cost the start nothing
MAX_COMMANDS = 50
COMMAND_CHARS = 200


def _compiler_commands(pgid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> command line of each live compiler process in group ``pgid``."""
    found: dict[int, str] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return found
    for entry in entries:
        stat = process_stat(entry)
        if stat is None or stat[0] not in COMPILERS or len(stat[1]) < 3 or stat[1][2] != str(pgid):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        found[int(entry.name)] = " ".join(a.decode(errors="replace") for a in argv if a)[:COMMAND_CHARS] or stat[0]
    return found


class CompilerWatch:
    """Compilers run in process group ``pgid`` while the watch runs: :meth:`stop` returns each
    command seen (one per process, at most :data:`MAX_COMMANDS`, in the order seen); ``count``
    is how many processes were seen. A compiler that runs for less than ``interval`` (a small
    Triton kernel's ptxas) may be missed."""

    def __init__(self, pgid: int, interval: float = INTERVAL_S, proc: Path = Path("/proc")) -> None:
        self.pgid = pgid
        self.interval = interval
        self.proc = proc
        self.seen: dict[int, str] = {}  # the first MAX_COMMANDS processes' commands
        self.count = 0  # every compiler process seen
        self._counted: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="foundry-ready-compilers", daemon=True)

    def start(self) -> CompilerWatch:
        if os.path.isdir(self.proc):  # not Linux: nothing to watch
            self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            for pid, command in _compiler_commands(self.pgid, self.proc).items():
                if pid in self._counted:
                    continue
                self._counted.add(pid)
                self.count += 1
                if len(self.seen) < MAX_COMMANDS:
                    self.seen[pid] = command
            self._stop.wait(self.interval)

    def stop(self) -> list[str]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return list(self.seen.values())
