"""A forked child makes the heap it inherited its own at once, on a thread, instead of page by
page as its code first writes to it.

A child forked from the fork server shares the server's memory pages until it writes to them:
each first write to a page costs a page fault and a copy (copy-on-write). Python writes to the
page of every object it uses (its reference count), so in the forked child every code path that
runs for the first time is slower than in a spawned child, whose import heap is its own from the
start. Walking the module namespaces of a vLLM import heap took 96.8 ms in a forked child, 26043
page faults, against 12.1 ms in its parent (on a 2-core x86_64 host). A request that comes while
the child still meets pages for the first time pays that.

So the child asks the kernel to take those faults up front (``madvise(MADV_POPULATE_WRITE)``,
Linux 5.14 and later: the pages are copied as if written, their contents untouched), on a daemon
thread, while its main thread starts the engine: ctypes lets go of the GIL for each call. On the
same host the thread copied 374 MiB in 0.18 s, and the same walk then took 11.4 ms with 173 page
faults. The child ends up with about the memory of a spawned child, which has its own import heap.

Only the private, writable, anonymous mappings the child had when it began are copied, each only
when at least half of it is resident (a sparse reservation would otherwise fill with zero pages),
:data:`MAX_BYTES` at most in all, in chunks of :data:`CHUNK` so that the main thread's own mapping
changes are not held up. ``FOUNDRY_FORK_PRIVATE_HEAP=0`` (or false, no, off) leaves the pages
shared until written, as a plain fork does.

This module imports only the standard library (ctypes only when the thread runs).
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

ENV = "FOUNDRY_FORK_PRIVATE_HEAP"
OFF_WORDS = ("0", "false", "no", "off")
MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14
CHUNK = 64 << 20
MAX_BYTES = 16 << 30
ITEM = "heap copy thread cpu"  # the critical-path line's overlapped item (critical_path.py)


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` leaves :data:`ENV` on (the default)."""
    return environ.get(ENV, "1").strip().lower() not in OFF_WORDS


@dataclass(frozen=True)
class MapsLine:
    """One line of ``/proc/self/maps``: [start, end) and whether it is private, writable and
    anonymous (no file, not the stack)."""

    start: int
    end: int
    anonymous_writable: bool

    @classmethod
    def parse(cls, line: str) -> MapsLine:
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        name = fields[5] if len(fields) > 5 else ""
        private_anon = fields[1] == "rw-p" and fields[4] == "0" and not name.startswith("[s")  # [stack], [stack:N]
        return cls(start, end, private_anon)


def inherited(maps_text: str) -> list[tuple[int, int]]:
    """The [start, end) ranges worth copying in a ``/proc/self/maps`` text."""
    ranges = []
    for line in maps_text.splitlines():
        if line.strip():
            m = MapsLine.parse(line)
            if m.anonymous_writable:
                ranges.append((m.start, m.end))
    return ranges


def resident_bytes(smaps_lines: Iterable[str], starts: set[int]) -> dict[int, int]:
    """{start: resident bytes} for the mappings of a ``/proc/self/smaps`` text that begin at one
    of ``starts``."""
    resident: dict[int, int] = {}
    current = None
    for line in smaps_lines:
        head = line.split(" ", 1)[0]
        if "-" in head and not head.endswith(":"):
            start = int(head.split("-", 1)[0], 16)
            current = start if start in starts else None
        elif current is not None and line.startswith("Rss:"):
            resident[current] = int(line.split()[1]) * 1024
    return resident


def worth_copying(ranges: list[tuple[int, int]], resident: Mapping[int, int],
                  max_bytes: int = MAX_BYTES) -> list[tuple[int, int]]:
    """The ranges at least half resident, in order, up to ``max_bytes`` in all."""
    kept, total = [], 0
    for start, end in ranges:
        size = end - start
        if resident.get(start, 0) * 2 >= size and total + size <= max_bytes:
            kept.append((start, end))
            total += size
    return kept


def chunks(ranges: Iterable[tuple[int, int]], size: int = CHUNK) -> Iterator[tuple[int, int]]:
    """(address, length) pieces of at most ``size`` bytes covering ``ranges``."""
    for start, end in ranges:
        for address in range(start, end, size):
            yield address, min(size, end - address)


@dataclass
class Outcome:
    """What the thread did: bytes copied, seconds, and why it stopped early (None: it did not)."""

    copied: int = 0
    seconds: float = 0.0
    stopped: str | None = None


class _Madvise:
    def __init__(self) -> None:
        import ctypes  # here, not at import: the start-up hook imports this module with client.py

        self._ctypes = ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        self._call = libc.madvise
        self._call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._call.restype = ctypes.c_int

    def populate_write(self, address: int, length: int) -> int:
        """0, or the errno of ``madvise(address, length, MADV_POPULATE_WRITE)``."""
        return 0 if self._call(address, length, MADV_POPULATE_WRITE) == 0 else self._ctypes.get_errno()


def copy(ranges: list[tuple[int, int]], madvise: _Madvise | None = None, smaps: str = "/proc/self/smaps") -> Outcome:
    """Copies ``ranges`` (from :func:`inherited`) where worth it (:func:`worth_copying`, by the
    residency in ``smaps``). A range the engine unmapped or protected meanwhile is skipped; a
    kernel without the call stops it."""
    began = time.perf_counter()
    outcome = Outcome()
    try:
        with open(smaps) as f:
            todo = worth_copying(ranges, resident_bytes(f, {start for start, _ in ranges}))
        madvise = madvise or _Madvise()
    except OSError as exc:
        outcome.stopped = f"cannot read /proc/self/smaps or call madvise ({exc})"
        return outcome
    for address, length in chunks(todo):
        code = madvise.populate_write(address, length)
        if code == 0:
            outcome.copied += length
        elif code == errno.EINVAL and not outcome.copied:  # a kernel before 5.14: the first call tells
            outcome.stopped = "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)"
            break
        # Else the range changed since it was noted (ENOMEM: unmapped; EFAULT, EPERM, EINVAL:
        # protected or remapped by the engine): skip it.
    outcome.seconds = time.perf_counter() - began
    return outcome


def start() -> threading.Thread | None:
    """In a child just forked: notes its mappings now, then copies them on a daemon thread, whose
    CPU time goes to the critical-path line's overlapped :data:`ITEM`. None when the mappings
    cannot be read."""
    try:
        with open("/proc/self/maps") as f:
            ranges = inherited(f.read())
    except OSError:
        return None

    def run() -> None:
        from foundry_core.engine.critical_path import LEDGER  # the child's ledger, empty since the fork

        with LEDGER.background(ITEM):
            RESULT.append(copy(ranges))

    thread = threading.Thread(target=run, name="foundry-heap-copy", daemon=True)
    thread.start()
    return thread


RESULT: list[Outcome] = []  # this process's outcome, once the thread is done (tests, diagnostics)
