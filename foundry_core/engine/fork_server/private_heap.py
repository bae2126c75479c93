"""A forked child makes the heap it inherited its own at once, on a thread, instead of page by
page as its code first writes to it.

A child forked from the fork server shares the server's memory pages until it writes to them:
each first write to a page costs a page fault and a copy (copy-on-write). Python writes to the
page of every object it uses (its reference count), so in the forked child every code path that
runs for the first time is slower than in a spawned child, whose import heap is its own from the
start. Walking the module namespaces of a vLLM import heap took 82-130 ms in a forked child, with
26000 page faults, against 12-13 ms in its parent (two runs on a 2-core x86_64 host). A request
that comes while the child still meets pages for the first time pays that.

So the child has the kernel take those faults up front (``madvise(MADV_POPULATE_WRITE)``, Linux
5.14 and later: each page is copied as if written, its contents untouched), on a daemon thread,
while its main thread starts the engine; ctypes lets go of the GIL for each call. On the same host
the thread copied 366 MiB in 0.32-0.50 s, and the same walk then took 14-21 ms with 140 page faults.

Only pages still shared are copied: present, and not mapped by this process alone
(``/proc/self/pagemap``), in the private, writable, anonymous mappings the child had when it began.
A page never touched is not filled, so the child ends up with about the memory of a spawned child,
which has its own import heap; a cgroup memory limit caps it at half the headroom left. The thread
works in pieces of :data:`PIECE` (each ``madvise`` holds the process's mapping lock, which the
main thread's own mmap and munmap wait for), and stops before the child forks again.

Off by default until a GPU run shows what it does to an engine's start and first requests:
``FOUNDRY_FORK_PRIVATE_HEAP=1`` (or true, yes, on) turns it on.

This module imports only the standard library; the child imports it after the fork.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("foundry.fork_server")

ENV = "FOUNDRY_FORK_PRIVATE_HEAP"
ON_WORDS = ("1", "true", "yes", "on")
MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14
PAGE = os.sysconf("SC_PAGE_SIZE")
PIECE = 2 << 20
MAX_BYTES = 16 << 30
FORKED = "the child forked"  # Outcome.stopped when the child forks again: expected, not a problem
ITEM = "heap copy thread cpu"  # the critical-path line's overlapped item (critical_path.py)
CGROUP = Path("/sys/fs/cgroup")
# A pagemap entry's top byte: bit 63 (0x80) present, bit 56 (0x01) mapped by this process alone.
_SHARED = bytes(1 if b & 0x81 == 0x80 else 0 for b in range(256))
_RUNS = re.compile(b"\x01+")


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` turns :data:`ENV` on (off by default: see the module)."""
    return environ.get(ENV, "0").strip().lower() in ON_WORDS


@dataclass(frozen=True)
class MapsLine:
    """One line of ``/proc/self/maps``: [start, end) and whether it is private, writable and
    anonymous (no file, not a stack)."""

    start: int
    end: int
    private_anon_writable: bool

    @classmethod
    def parse(cls, line: str) -> MapsLine:
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        name = fields[5] if len(fields) > 5 else ""
        stack = name == "[stack]" or name.startswith("[stack:")
        return cls(start, end, fields[1] == "rw-p" and fields[4] == "0" and not stack)


def inherited(maps_text: str) -> list[tuple[int, int]]:
    """The [start, end) ranges worth looking at in a ``/proc/self/maps`` text."""
    lines = (MapsLine.parse(line) for line in maps_text.splitlines() if line.strip())
    return [(m.start, m.end) for m in lines if m.private_anon_writable]


def shared_runs(entries: bytes, address: int) -> Iterator[tuple[int, int]]:
    """(address, length) of each run of pages still shared in ``entries``: the pagemap entries
    (8 bytes each, little-endian) of the pages from ``address`` on."""
    for run in _RUNS.finditer(entries[7::8].translate(_SHARED)):
        yield address + run.start() * PAGE, (run.end() - run.start()) * PAGE


def pieces(ranges: list[tuple[int, int]], size: int | None = None) -> Iterator[tuple[int, int]]:
    """(address, length) pieces of at most ``size`` (default :data:`PIECE`) covering ``ranges``."""
    size = size or PIECE
    for start, end in ranges:
        for address in range(start, end, size):
            yield address, min(size, end - address)


def headroom(cgroup: Path = CGROUP) -> int | None:
    """Bytes this cgroup (v2) may still use before its limit; None when it has none or says none."""
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        used = int((cgroup / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


@dataclass
class Outcome:
    """What the thread did: bytes of shared pages copied, seconds, and why it stopped early (None:
    it did not)."""

    copied: int = 0
    seconds: float = 0.0
    stopped: str | None = None


class Madvise:
    """``madvise(MADV_POPULATE_WRITE)`` through ctypes (which lets go of the GIL for the call)."""

    def __init__(self) -> None:
        self._call = ctypes.CDLL(None, use_errno=True).madvise
        self._call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._call.restype = ctypes.c_int

    def populate_write(self, address: int, length: int) -> int:
        """0, or the errno of the call; ``(0, 0)`` asks whether the kernel knows it."""
        return 0 if self._call(address, length, MADV_POPULATE_WRITE) == 0 else ctypes.get_errno()


def populate(ranges: list[tuple[int, int]], madvise: Madvise | None = None, pagemap: str = "/proc/self/pagemap",
             stop: threading.Event | None = None, max_bytes: int | None = None) -> Outcome:
    """Copies the pages of ``ranges`` (from :func:`inherited`) still shared, piece by piece, each
    piece's pages read from ``pagemap`` just before; up to ``max_bytes`` (default: :data:`MAX_BYTES`,
    or half the cgroup's headroom when less), until ``stop`` is set."""
    began, outcome = time.perf_counter(), Outcome()
    room = headroom()
    limit = max_bytes if max_bytes is not None else min(MAX_BYTES, room // 2 if room is not None else MAX_BYTES)
    try:
        madvise = madvise or Madvise()
        if madvise.populate_write(0, 0) != 0:
            outcome.stopped = "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)"
            return outcome
        with open(pagemap, "rb", buffering=0) as entries:
            for address, length in pieces(ranges):
                if stop is not None and stop.is_set():
                    outcome.stopped = FORKED
                    break
                entries.seek(address // PAGE * 8)
                for run, size in shared_runs(entries.read(length // PAGE * 8), address):
                    if outcome.copied + size > limit:
                        outcome.stopped = f"the cap of {limit >> 20} MiB"
                        return outcome
                    code = madvise.populate_write(run, size)
                    if code == errno.ENOMEM:  # unmapped since, or no memory left: either way, stop
                        outcome.stopped = "ENOMEM"
                        return outcome
                    outcome.copied += size if code == 0 else 0  # EINVAL, EFAULT: changed since; skipped
    except OSError as exc:
        outcome.stopped = f"cannot read {pagemap} ({exc})"
    finally:
        outcome.seconds = time.perf_counter() - began
    return outcome


_OUTCOMES: list[Outcome] = []
_STOP = threading.Event()
_thread: threading.Thread | None = None
_fork_hook = False


def last_outcome() -> Outcome | None:
    """This process's outcome, once its thread is done (tests, diagnostics)."""
    return _OUTCOMES[-1] if _OUTCOMES else None


def _before_fork() -> None:
    # A child of this child would inherit the pages half copied and share them again: stop first.
    _STOP.set()
    if _thread is not None:
        _thread.join(0.1)


def _say(outcome: Outcome) -> None:
    """One line: what was copied, or why not all of it (a warning: its first requests then take
    the page faults for the rest, as in a plain fork)."""
    done = f"copied {outcome.copied >> 20} MiB of the heap it inherited in {outcome.seconds:.2f} s"
    if outcome.stopped in (None, FORKED):
        logger.info("foundry: this forked process %s", done)
    else:
        logger.warning("foundry: this forked process %s, then stopped: %s; the rest stays shared with the fork server "
                       "until written (%s=0 turns the copy off)", done, outcome.stopped, ENV)


def start() -> threading.Thread | None:
    """In a child just forked: notes its mappings now, then copies their shared pages on a daemon
    thread, whose CPU time goes to the critical-path line's overlapped :data:`ITEM`. None when it
    could not start (logged). Never raises: the child then runs with its pages shared, as a plain
    fork."""
    global _thread, _fork_hook
    try:
        with open("/proc/self/maps") as f:
            ranges = inherited(f.read())

        def run() -> None:
            from foundry_core.engine.critical_path import LEDGER  # the child's ledger, empty since the fork

            with LEDGER.background(ITEM):
                outcome = populate(ranges, stop=_STOP)
            _OUTCOMES.append(outcome)
            _say(outcome)

        if not _fork_hook:
            os.register_at_fork(before=_before_fork)
            _fork_hook = True
        _thread = threading.Thread(target=run, name="foundry-heap-copy", daemon=True)
        _thread.start()
        return _thread
    except Exception as exc:  # noqa: BLE001 - best effort: the child's engine start must go on
        logger.warning("foundry: this forked process keeps the heap it inherited shared until written (the copy did "
                       "not start: %s: %s)", type(exc).__name__, exc)
        return None
