"""Foundry's own seconds on a process's critical path: what the engine's start waits on Foundry
for, by item, logged in one line once per process.

The places that cost the start time record into :data:`LEDGER` (this process's ledger):
:meth:`Ledger.timed` around work the start waits for, :meth:`Ledger.add` for seconds measured
elsewhere (the start-up hook's restart, before this module was imported). The line::

    foundry: critical path in this process (rank 0): 0.123 s (restart 0.050, plugin import 0.031,
    archive check 0.020); overlapped, not in the total: images thread cpu 0.090

(one line; ``(rank N)`` only where a model-running process reports it). The items in parentheses
add up to the total. After ``overlapped`` come the CPU seconds of Foundry's own threads: they run
while the engine loads its weights and compete with it only for the GIL and the cores, which
costs the start some share of them that no clock in this process can tell apart, so they are
shown beside the total and not in it; and ``engine imports`` (:meth:`Ledger.engine_work`): the
engine's modules that installing a seam imported, ahead of the engine, which imports them anyway.

Reported by the worker runtime when its start-up phase ends (the restore or the capture,
:meth:`foundry_core.engine.worker.WorkerRuntime.in_phase`), and otherwise at the process's exit
when anything was recorded (the first process of an engine, which runs no model). A forked child
starts with an empty ledger (``os.register_at_fork``): what its parent recorded is the parent's
line, so a start's lines add up without counting anything twice: the processes without a rank run
one after the other before the ranks, which run side by side (:func:`combine`, what
``foundry ready`` does with a start's log).

Nesting: every second is counted once, under the innermost :meth:`~Ledger.timed` block that is
open on the thread. An outer block's item gets its own time minus its inner blocks' (whatever
their items), so a block of the same item inside another adds nothing twice. Item names are
short lower-case words (:data:`ITEM`): the line is parsed back.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ITEM", "LEDGER", "Ledger", "ReportedLine", "Combined", "combine", "ImportTime", "import_seconds", "import_time", "parse_line",
           "take_startup"]

logger = logging.getLogger("foundry")

ITEM = re.compile(r"[a-z][a-z ]{0,30}[a-z]")
PREFIX = "foundry: critical path in this process"
OVERLAPPED = "overlapped, not in the total"
# The start-up hook, as foundry-autopreload.pth imports it (foundry_core/autopreload.py installed).
HOOK_MODULE = "_foundry_autopreload"


@dataclass
class _Open:
    """A timed block open on a thread: its item and the seconds its inner blocks took."""

    item: str
    generation: int
    inner: float = 0.0


class Ledger:
    """This process's critical-path seconds by item (see the module). Thread-safe. ``clock`` and
    ``thread_clock``: wall and thread CPU seconds (perf_counter and thread_time; fakes in tests)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 thread_clock: Callable[[], float] = time.thread_time) -> None:
        self._clock = clock
        self._thread_clock = thread_clock
        self._lock = threading.Lock()
        self._items: dict[str, float] = {}
        self._overlapped: dict[str, float] = {}
        self._local = threading.local()
        self._generation = 0  # bumped when it forgets: a block opened before records nothing
        self.reported = False

    @staticmethod
    def _check(item: str) -> None:
        if not ITEM.fullmatch(item):
            raise ValueError(f"critical-path item {item!r}: use 2-32 lower-case letters and spaces")

    def add(self, item: str, seconds: float) -> None:
        """Adds ``seconds`` to ``item``'s total. For time measured outside any open
        :meth:`timed` block (it is not taken from one)."""
        self._check(item)
        with self._lock:
            self._items[item] = self._items.get(item, 0.0) + max(seconds, 0.0)

    def add_overlapped(self, item: str, seconds: float) -> None:
        """Adds ``seconds`` to an informational item, shown beside the total and not in it."""
        self._check(item)
        with self._lock:
            self._overlapped[item] = self._overlapped.get(item, 0.0) + max(seconds, 0.0)

    def count_part(self, overlapped_item: str, item: str, seconds: float) -> float:
        """Moves up to ``seconds`` of the overlapped ``overlapped_item`` into ``item`` and returns
        what it moved: the share of a wait for the engine's work (:meth:`engine_work`) that was
        Foundry's own, known only once the wait is over."""
        self._check(item)
        with self._lock:
            have = self._overlapped.get(overlapped_item, 0.0)
            moved = min(max(seconds, 0.0), have)
            if have - moved > 0.0:
                self._overlapped[overlapped_item] = have - moved
            else:  # all of it was Foundry's: no empty item in the line
                self._overlapped.pop(overlapped_item, None)
            if moved > 0.0:
                self._items[item] = self._items.get(item, 0.0) + moved
            return moved

    def _stack(self) -> list[_Open]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def timed(self, item: str) -> contextlib.AbstractContextManager[None]:
        """Adds the block's wall time (perf_counter) to ``item``, less its inner blocks' (see the
        module on nesting), also when it raises. Records nothing on a thread inside
        :meth:`background`: the start does not wait there."""
        return self._block(item, counted=True)

    def engine_work(self, item: str) -> contextlib.AbstractContextManager[None]:
        """A block of the engine's own work that Foundry only runs earlier than the engine would
        (importing an engine module that a seam wraps: the engine imports it before it can call
        it): its wall time leaves the enclosing block's item, as an inner block's does, and is
        shown beside the total, not in it."""
        return self._block(item, counted=False)

    @contextlib.contextmanager
    def _block(self, item: str, counted: bool) -> Iterator[None]:
        self._check(item)
        if getattr(self._local, "background", 0):
            yield
            return
        stack = self._stack()
        frame = _Open(item, self._generation)
        stack.append(frame)
        start = self._clock()
        try:
            yield
        finally:
            elapsed = self._clock() - start
            stack.pop()
            if frame.generation == self._generation:
                if stack:
                    stack[-1].inner += elapsed
                (self.add if counted else self.add_overlapped)(item, elapsed - frame.inner)

    @contextlib.contextmanager
    def background(self, item: str) -> Iterator[None]:
        """For the body of one of Foundry's own threads: :meth:`timed` blocks in it record
        nothing, and the thread's CPU time (``time.thread_time``) goes to the overlapped ``item``."""
        self._check(item)
        self._local.background = getattr(self._local, "background", 0) + 1
        cpu = self._thread_clock()
        try:
            yield
        finally:
            self._local.background -= 1
            self.add_overlapped(item, self._thread_clock() - cpu)

    def total(self) -> float:
        with self._lock:
            return sum(self._items.values())

    def items(self) -> dict[str, float]:
        """Seconds by item, in the order the items were first recorded."""
        with self._lock:
            return dict(self._items)

    def overlapped(self) -> dict[str, float]:
        with self._lock:
            return dict(self._overlapped)

    def recorded(self) -> bool:
        with self._lock:
            return bool(self._items or self._overlapped)

    def line(self, rank: int | None = None) -> str:
        """The report line (see the module)."""
        items, overlapped = self.items(), self.overlapped()
        where = f" (rank {rank})" if rank is not None else ""
        text = f"{PREFIX}{where}: {sum(items.values()):.3f} s"
        if items:
            text += " (" + ", ".join(f"{name} {s:.3f}" for name, s in items.items()) + ")"
        if overlapped:
            text += f"; {OVERLAPPED}: " + ", ".join(f"{name} {s:.3f}" for name, s in overlapped.items())
        return text

    def report(self, log: logging.Logger = logger, rank: int | None = None) -> bool:
        """Logs :meth:`line` at INFO unless this process reported already; True when it logged."""
        with self._lock:
            if self.reported:
                return False
            self.reported = True
        log.info("%s", self.line(rank))
        return True

    def report_at_exit(self, log: logging.Logger = logger) -> bool:
        """:meth:`report`, when anything was recorded (what atexit calls)."""
        return self.recorded() and self.report(log)

    def reset(self) -> None:
        """Forgets everything (tests)."""
        with self._lock:
            self._forget()

    def after_fork_in_child(self) -> None:
        """A forked child's start: forgets everything with a new lock (another thread of the
        parent may have held the old one at the fork)."""
        self._lock = threading.Lock()
        self._forget()

    def _forget(self) -> None:
        self._items = {}
        self._overlapped = {}
        self._generation += 1
        self.reported = False


LEDGER = Ledger()
os.register_at_fork(after_in_child=LEDGER.after_fork_in_child)
atexit.register(LEDGER.report_at_exit)


# ---- the start-up hook's seconds (foundry_core/autopreload.py) --------------------------------------------


def _hook(hook: Any) -> Any:
    # The hook imports nothing of Foundry's (it runs in every interpreter), so it keeps its
    # seconds itself; it is in sys.modules wherever the .pth ran.
    return sys.modules.get(HOOK_MODULE) if hook is None else hook


def take_startup(ledger: Ledger = LEDGER, hook: Any = None) -> dict[str, float]:
    """Moves what the start-up hook spent in this process (``restart``, ``early start``; its
    ``engine imports`` beside the total) into ``ledger``, once; returns it. Nothing when the hook
    recorded nothing here (a forked child sees its parent's values: they carry the parent's pid)."""
    hook = _hook(hook)
    seconds = getattr(hook, "startup_seconds", None)
    if not seconds or getattr(hook, "startup_pid", None) != os.getpid():
        return {}
    taken = dict(seconds)
    seconds.clear()
    engine_work = getattr(hook, "ENGINE_WORK", None)
    for item, s in taken.items():
        (ledger.add_overlapped if item == engine_work else ledger.add)(item, s)
    return taken


def import_seconds(started: float, hook: Any = None) -> float:
    """Seconds since ``started`` (perf_counter, taken where a module's import began), or 0.0
    when the import ran inside the start-up hook's early starts, whose time the hook counts."""
    now = time.perf_counter()
    hook = _hook(hook)
    began, ended = getattr(hook, "early_start_began", None), getattr(hook, "early_start_ended", None)
    if isinstance(began, float) and began <= started and ended is None:
        return 0.0
    return now - started


@dataclass(frozen=True)
class ImportTime:
    """A module's import seconds (:func:`import_seconds`) and the process that waited for them."""

    seconds: float
    pid: int

    def here(self) -> float:
        """The seconds in the importing process; 0.0 in a child forked after the import (SGLang's
        schedulers, forked from a fork server that imported the plugin), which did not wait."""
        return self.seconds if os.getpid() == self.pid else 0.0


def import_time(started: float, hook: Any = None) -> ImportTime:
    """:func:`import_seconds` with this process's pid."""
    return ImportTime(import_seconds(started, hook), os.getpid())


# ---- reading the line back (foundry ready) ------------------------------------------------------------------

_LINE = re.compile(re.escape(PREFIX) + r"(?: \(rank (?P<rank>\d+)\))?: (?P<total>\d+\.\d+) s"
                   r"(?: \((?P<items>[^)]*)\))?(?:; " + re.escape(OVERLAPPED) + r": (?P<overlapped>[^;]*))?")
_PAIR = re.compile(r"\s*(" + ITEM.pattern + r") (\d+\.\d+)\s*")


@dataclass(frozen=True)
class ReportedLine:
    """One process's line, parsed: ``rank`` None for a process that runs no model."""

    rank: int | None
    total: float
    items: dict[str, float]
    overlapped: dict[str, float]


def _pairs(text: str | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        m = _PAIR.fullmatch(part)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def parse_line(text: str) -> ReportedLine | None:
    """The report line in ``text`` (a log line, prefixes and all), or None."""
    m = _LINE.search(text)
    if m is None:
        return None
    rank = m.group("rank")
    return ReportedLine(int(rank) if rank is not None else None, float(m.group("total")), _pairs(m.group("items")),
                        _pairs(m.group("overlapped")))


@dataclass(frozen=True)
class Combined:
    """A start's critical path from its processes' lines: ``lines`` how many were combined."""

    total: float
    items: dict[str, float] = field(default_factory=dict)
    overlapped: dict[str, float] = field(default_factory=dict)
    lines: int = 0


def _summed(lines: Iterable[ReportedLine], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in lines:
        for name, s in getattr(line, key).items():
            out[name] = round(out.get(name, 0.0) + s, 6)
    return out


def combine(lines: Sequence[ReportedLine]) -> Combined | None:
    """One start's lines as one critical path: every process without a rank (they precede the
    ranks: the first process restarts and imports before it starts them) plus the rank with the
    largest total (ranks start side by side). An upper bound where a process without a rank
    records work after the ranks started or beside the first process (SGLang's fork server, which
    imports while the first process does). None without lines."""
    if not lines:
        return None
    chosen = [line for line in lines if line.rank is None]
    ranked = [line for line in lines if line.rank is not None]
    if ranked:
        chosen.append(max(ranked, key=lambda line: line.total))
    return Combined(round(sum(line.total for line in chosen), 6), _summed(chosen, "items"),
                    _summed(chosen, "overlapped"), len(lines))
