"""Carrying a start's compile caches when its engine has no seam after them: SAVE carries what the
start used so far and again when its first requests use more; LOAD places the archive's files on a
thread while the engine loads its model.

- :func:`carry_in` (SAVE and LOAD, before the engine compiles anything): the archive's carried
  caches (LOAD) and Triton's carrier over them.
- :class:`CacheCarry` (SAVE): Triton's key directories the process looked up
  (:class:`~foundry_core.engine.triton_cache.TritonCarrier`) and the directories of the engine's
  cache trees its start used (``trees()``, asked again each time: e.g.
  :func:`foundry_core.engine.jit_dirs.trees`). :meth:`CacheCarry.carry` adds what is new since the
  last carry and writes the rank's list; :meth:`CacheCarry.watch` keeps carrying on a thread for a
  while: a server compiles kernels at its first requests, after the start-up the engine's seams
  cover. Each entry is carried at the first look that finds it complete, so a SAVE stopped
  seconds after its first requests keeps them. A JIT module is used once its library is loaded,
  so it is complete; a Triton kernel is used from its lookup, before Triton compiles it, and is
  complete once its group file (which Triton writes last) or its module is there
  (:func:`~foundry_core.engine.triton_cache.written`). One still incomplete when nothing new has
  appeared for :data:`QUIET_S` is carried as far as it is written (as is one that
  :meth:`CacheCarry.carry` finds incomplete), and again if it completes while the watch lasts; a
  LOAD compiles a kernel that never did.
- :class:`CachesAhead` (LOAD): places the carried trees the host lacks
  (:meth:`~foundry_core.engine.host_caches.HostCaches.restore`) on a thread, and the Triton
  kernels carried from Triton's own directory through Triton's carrier (as if Triton had looked
  each up: every one was used at SAVE);
  :meth:`CachesAhead.wait` joins it before the engine can first look (the copy overlaps the
  engine's own work; what is left of it then, the start waits for, and the wait is logged; a
  Triton kernel looked up earlier is restored by the carrier at its lookup). On the start's
  critical path (:mod:`foundry_core.engine.critical_path`) is the wait (``host caches``); the
  thread's CPU time is shown beside it (``caches thread cpu``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from foundry_core.engine import triton_cache
from foundry_core.engine.critical_path import LEDGER
from foundry_core.engine.host_caches import CacheTree, Copied, HostCaches
from foundry_core.engine.triton_cache import CACHE as TRITON, TritonCarrier, written

logger = logging.getLogger("foundry")

__all__ = ["CacheCarry", "CachesAhead", "carry_in"]

POLL_S = 1.0   # how often the watch looks for new entries
QUIET_S = 2.0  # how long nothing new must appear before the watch carries


def carry_in(archive: str | os.PathLike, rank_dir: str | os.PathLike,
             load: bool) -> tuple[HostCaches | None, TritonCarrier | None]:
    """The rank's carried caches when ``load`` (None: the archive carries none, or SAVE) and the
    Triton carrier over them, installed (None: Triton's cache is not carried in this process)."""
    source = HostCaches.read(archive, rank_dir) if load else None
    carrier = TritonCarrier(source)
    return source, carrier if triton_cache.install(carrier) else None


class CacheCarry:
    """SAVE: this process's used cache entries, carried into ``caches`` (see the module)."""

    def __init__(self, caches: HostCaches, triton: TritonCarrier | None,
                 trees: Callable[[], Sequence[CacheTree]], log: logging.Logger = logger) -> None:
        self.caches = caches
        self.triton = triton
        self.trees = trees
        self.log = log
        self._carried: set[tuple[str, str]] = set()  # (cache, directory) already carried
        # Triton kernels carried while incomplete (directory -> key): the watch carries them again once complete
        self._partial: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def pending(self) -> tuple[dict[str, str], list[CacheTree]]:
        """What is used and not carried yet: Triton's key directories (directory -> key) and the
        trees with only their new directories in ``used``."""
        used = dict(self.triton.used) if self.triton is not None else {}  # a copy: Triton's threads add to it
        return self._uncarried(used, self.trees())

    def _uncarried(self, keys: dict[str, str], trees: Sequence[CacheTree]) -> tuple[dict[str, str], list[CacheTree]]:
        """``keys`` and ``trees`` less what is carried already."""
        left = {d: k for d, k in keys.items() if (TRITON, d) not in self._carried}
        new_trees = []
        for tree in trees:
            new = tuple(sub for sub in tree.used if (tree.cache, sub) not in self._carried)
            if new:
                new_trees.append(replace(tree, used=new))
        return left, new_trees

    def carry(self, what: str = "compile caches",
              only: tuple[dict[str, str], list[CacheTree]] | None = None) -> Copied | None:
        """Adds what is pending (or ``only`` that part of it, as :meth:`pending` gives it) and
        writes the list (nothing when nothing is pending); None when an OSError (a full disk)
        stopped it, which is logged: the archive's graphs are complete without its caches."""
        with self._lock:
            start = time.perf_counter()
            # ``only`` is filtered here, under the lock: the watch and a caller may both carry it
            keys, trees = self.pending() if only is None else self._uncarried(*only)
            done = Copied()
            if not keys and not trees:
                return done
            # Looked at before the copy: one completing during it is carried again, never taken as whole.
            incomplete = {d: k for d, k in keys.items() if not written(d)}
            try:
                if keys:
                    subset = TritonCarrier(home=self.triton.home if self.triton is not None else None)
                    subset.used = keys
                    done.add(subset.carry(self.caches))
                for tree in trees:
                    done.add(self.caches.add_used(tree))
                self.caches.write_list()
            except OSError as exc:
                self.log.warning("foundry: %s not carried in the archive (%s); a LOAD on another host compiles them",
                                 what, exc)
                return None
            self._carried |= {(TRITON, d) for d in keys} | {(t.cache, sub) for t in trees for sub in t.used}
            self._partial |= incomplete
            self.log.info("foundry: %s carried in the archive: %s, in %.2f s", what, done.describe(),
                          time.perf_counter() - start)
            return done

    def watch(self, seconds: float, poll: float = POLL_S, quiet: float = QUIET_S) -> threading.Thread:
        """Carries new entries on a daemon thread for ``seconds`` (or until :meth:`stop`), each
        complete one when seen, an incomplete one once none has appeared for ``quiet`` seconds;
        returns the started thread."""
        self.thread = threading.Thread(target=self._watch, args=(seconds, poll, quiet), name="foundry-cache-carry",
                                       daemon=True)
        self.thread.start()
        return self.thread

    def _watch(self, seconds: float, poll: float, quiet: float) -> None:
        what = "compile caches of the first requests"
        end = time.monotonic() + seconds
        said = False
        waiting: frozenset[str] = frozenset()  # the incomplete kernels at the last look
        changed = time.monotonic()
        while time.monotonic() < end and not self._stop.wait(poll):
            keys, trees = self.pending()
            if (keys or trees) and not said:
                self.log.info("foundry: new compile-cache entries in use (%d Triton kernels, %d other); each carried "
                              "once complete", len(keys), sum(len(t.used) for t in trees))
                said = True
            complete = {d: k for d, k in keys.items() if written(d)} | self._finished()
            if complete or trees:
                if self.carry(what, only=(complete, trees)) is None:
                    return  # said why; the archive stays as it is
            # The set, not its size: one kernel completing as another appears is not quiet.
            incomplete = frozenset(d for d in keys if d not in complete)
            if incomplete != waiting:
                waiting, changed = incomplete, time.monotonic()
            elif incomplete and time.monotonic() - changed >= quiet:
                rest = {d: keys[d] for d in incomplete}
                if self.carry(what + " (as far as written)", only=(rest, [])) is None:
                    return
                waiting = frozenset()

    def _finished(self) -> dict[str, str]:
        """The kernels carried while incomplete that are complete now, made pending again."""
        with self._lock:
            finished = {d: self._partial.pop(d) for d in list(self._partial) if written(d)}
            self._carried -= {(TRITON, d) for d in finished}
        return finished

    def stop(self) -> None:
        """Ends the watch and waits for it."""
        self._stop.set()
        if self.thread is not None:
            self.thread.join()


class CachesAhead:
    """LOAD: ``trees`` of ``source`` and, through ``triton`` (the installed carrier over ``source``),
    Triton's carried kernels placed into this host's caches on a thread (see the module);
    ``setup_s``: what the caller spent before it (reading the list), reported with the wait."""

    def __init__(self, source: HostCaches, trees: Sequence[CacheTree], log: logging.Logger = logger,
                 setup_s: float = 0.0, triton: TritonCarrier | None = None) -> None:
        self.source = source
        self.trees = list(trees)
        self.triton = triton
        self.log = log
        self.setup_s = setup_s
        self.done = Copied()
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, name="foundry-caches-ahead", daemon=True)

    def start(self) -> CachesAhead:
        start = time.perf_counter()
        self._thread.start()
        self.setup_s += time.perf_counter() - start
        return self

    def _run(self) -> None:
        with LEDGER.background("caches thread cpu"):
            self._place()

    def _place(self) -> None:
        start = time.perf_counter()
        for tree in self.trees:
            try:
                self.done.add(self.source.restore(tree))
            except Exception as exc:  # noqa: BLE001 - a failed unit is undone; the engine compiles what is missing
                self.log.warning("foundry: %s not taken from the archive (%s: %s); the engine compiles what it lacks",
                                 tree.cache, type(exc).__name__, exc)
        if self.triton is not None:
            try:
                self._triton_ahead(self.triton)
            except Exception as exc:  # noqa: BLE001 - the kernels left are placed at their lookups
                self.log.warning("foundry: Triton's carried kernels not all placed ahead (%s: %s); the rest are placed "
                                 "when Triton looks them up", type(exc).__name__, exc)
        self.seconds = time.perf_counter() - start

    def _triton_ahead(self, carrier: TritonCarrier) -> None:
        """Every kernel carried from Triton's own directory, restored where Triton will look for it
        (its cache directory and the kernel's key; the carrier skips a key already looked up and
        logs a failure). Inductor's kernels are left to their lookups (see
        :mod:`~foundry_core.engine.triton_cache`)."""
        if carrier.home is None:
            self.log.warning("foundry: Triton's carried kernels are not placed ahead: its cache directory is unknown; "
                             "each is placed when Triton first looks it up, on the start's path")
            return
        for key in sorted({rel.partition("/")[0] for rel in self.source.paths(TRITON)}):
            placed = carrier.looked_up(key, os.path.join(carrier.home, key))
            if placed is not None:  # only this thread's: lookups on the engine's path count there
                self.done.add(placed)

    def wait(self) -> Copied:
        """Joins the thread and says what it placed and what the start spent on it."""
        start = time.perf_counter()
        with LEDGER.timed("host caches"):
            self._thread.join()
        if self.done.files or self.done.refused:
            self.log.info("foundry: JIT caches from the archive: %s on a thread in %.2f s (the start spent %.3f s "
                          "setting it up and waited %.3f s)", self.done.describe(), self.seconds or 0.0, self.setup_s,
                          time.perf_counter() - start)
        return self.done
