"""Triton's kernel cache, carried in the archive (:mod:`foundry_core.engine.host_caches`).

Triton keeps each kernel it compiled (and each launcher module it built) in a directory of its
cache named by a hash of the source, compiler and GPU, and looks that directory up through its
cache manager before compiling. In the engine's worker process the runtime makes Triton's manager
a :class:`FileCacheManager` that also tells a :class:`TritonCarrier` each directory looked up:

- at SAVE the carrier remembers them, and after the engine's warmup the directories the start
  used are carried, also those the host's cache already held;
- at LOAD the carrier fills a directory the host lacks from the archive before Triton looks inside,
  so a fresh host loads the kernels instead of compiling them (the sampler's kernels in vLLM's JIT
  warmup: 14-17 s on an H200 host with a cold cache).

Only this process uses the manager (``triton.knobs.cache.manager_class``, Triton 3.4 and later);
a user's own ``TRITON_CACHE_MANAGER`` is left in place, and nothing is carried then.

Triton's group files (``__grp__*.json``) name their members by absolute paths. They are carried
with the key directory replaced by :data:`KEY_DIR` and written back with the loading host's.

Not every kernel lives in Triton's own cache directory (``triton.knobs.cache.dir`` when the carrier
is installed, before the engine compiles anything): Inductor points Triton at its own per-device
directory (``$TORCHINDUCTOR_CACHE_DIR/triton/<device>``) once it compiles. SAVE carries the kernels
of Triton's own directory as :data:`CACHE`, which a LOAD places ahead on a thread, and the others
as :data:`ELSEWHERE`, placed only where a lookup asks for them: a LOAD that restores its graphs
runs none of Inductor's kernels, and a LOAD that falls back and compiles looks each one up.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from foundry_core.engine import triton_cache_manager
from foundry_core.engine.critical_path import LEDGER
from foundry_core.engine.host_caches import Copied, HostCaches
from foundry_core.engine.triton_cache_manager import manager_class

logger = logging.getLogger("foundry")

CACHE = "triton"  # kernels SAVE found in Triton's own cache directory (LOAD places them ahead)
ELSEWHERE = "triton-elsewhere"  # kernels SAVE found in a directory Inductor pointed Triton at
MANAGER_ENV = "TRITON_CACHE_MANAGER"
KEY_DIR = "${FOUNDRY_TRITON_KEY_DIR}"
GROUP_PREFIX = "__grp__"
MISSING_SAID = 20  # LOAD: how many missing cache entries the log names


def _rewrite_group(content: bytes, old: str, new: str) -> bytes:
    """A group file with each member path under ``old`` moved under ``new`` (others unchanged)."""
    try:
        data = json.loads(content)
    except ValueError:
        return content
    children = data.get("child_paths") if isinstance(data, dict) else None
    if not isinstance(children, dict):
        return content
    prefix = old.rstrip("/") + "/"
    data["child_paths"] = {name: (new.rstrip("/") + "/" + p[len(prefix):]
                                  if isinstance(p, str) and p.startswith(prefix) else p)
                           for name, p in children.items()}
    return json.dumps(data).encode()


def _holds_files(directory: str) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def _is_group(path: str) -> bool:
    return os.path.basename(path).startswith(GROUP_PREFIX)


def written(directory: str) -> bool:
    """Whether Triton has finished writing a key directory: a kernel's group file is its last
    file, and a module (a launcher, ``cuda_utils``) is one ``.so``, put whole by a rename."""
    try:
        with os.scandir(directory) as entries:
            return any(_is_group(e.name) or e.name.endswith(".so") for e in entries)
    except OSError:
        return False


class TritonCarrier:
    """The key directories this process looked up (SAVE) and the archive they come from (LOAD).

    ``source``: the archive's carried caches at LOAD, or None (SAVE, or an archive without them);
    ``home``: Triton's own cache directory (:func:`install` sets it), None when unknown (every
    kernel is then carried as :data:`CACHE`).
    """

    def __init__(self, source: HostCaches | None = None, home: str | None = None) -> None:
        self.source = source
        self.home = home
        self.used: dict[str, str] = {}  # key directory on this host -> its key
        self.seeded = Copied()
        self.missing: list[str] = []  # LOAD: keys looked up that neither the archive nor the host held
        self._lock = threading.Lock()

    def looked_up(self, key: str, directory: str) -> Copied | None:
        """Triton's manager opened ``directory`` (the cache's directory of ``key``); returns what
        this call placed from the archive (None: nothing). What Triton waits here (the lock, a
        restore) counts on the start's critical path as ``host caches``."""
        with LEDGER.timed("host caches"):
            return self._look_up(key, directory)

    def _look_up(self, key: str, directory: str) -> Copied | None:
        with self._lock:
            if directory in self.used:
                return None
            self.used[directory] = key
            cache = self._carrying(key)
            if cache is None:
                if self.source is not None and not _holds_files(directory):
                    self._note_missing(key)
                return None
            try:
                copied = self.source.restore_tree(
                    cache, directory, key, strip=True, last=_is_group,
                    rewrite=lambda rel, content: _rewrite_group(content, KEY_DIR, directory) if _is_group(rel)
                    else content)
            except OSError as exc:
                logger.warning("foundry: Triton kernel %s not taken from the archive (%s); Triton compiles it", key,
                               exc)
                return None
            self.seeded.add(copied)
            return copied

    def _note_missing(self, key: str) -> None:
        """A key neither the archive nor this host holds: Triton builds it (a kernel, a launcher or
        a module). Logged for the first :data:`MISSING_SAID`, then counted in one line."""
        self.missing.append(key)
        if len(self.missing) <= MISSING_SAID:
            logger.info("foundry: Triton cache entry %s is neither carried in the archive nor on this host; Triton "
                        "builds it", key)
        elif len(self.missing) == MISSING_SAID + 1:
            logger.info("foundry: more Triton cache entries are neither carried nor on this host; further ones are "
                        "not named (TritonCarrier.missing counts them)")

    def _carrying(self, key: str) -> str | None:
        """The archive's cache that carries ``key`` (None: none does, or no archive)."""
        if self.source is None:
            return None
        return next((cache for cache in (CACHE, ELSEWHERE) if self.source.paths(cache, key)), None)

    def cache_of(self, directory: str) -> str:
        """The carried cache a key directory of this host goes to: :data:`CACHE` when it is in
        Triton's own directory (or that is unknown), else :data:`ELSEWHERE`."""
        parent = os.path.realpath(Path(directory).parent)
        return CACHE if self.home is None or parent == self.home else ELSEWHERE

    def carry(self, caches: HostCaches) -> Copied:
        """Adds the key directories looked up so far to ``caches`` (SAVE)."""
        with self._lock:
            used = dict(self.used)
        done = Copied()
        for directory, key in sorted(used.items()):
            done.add(caches.add_tree(
                self.cache_of(directory), str(Path(directory).parent), key,
                rewrite=lambda rel, content, d=directory: _rewrite_group(content, d, KEY_DIR) if _is_group(rel)
                else content))
        return done


def current() -> TritonCarrier | None:
    """This process's carrier (None: Triton's cache is not carried here)."""
    carrier = triton_cache_manager.listener()
    return carrier if isinstance(carrier, TritonCarrier) else None


def install(carrier: TritonCarrier) -> bool:
    """Makes Triton open its cache directories through ``carrier`` in this process. False (and
    nothing changed) when Triton is not installed, predates ``triton.knobs`` (3.4), or the user
    chose another cache manager."""
    try:
        from triton import knobs
    except ImportError:
        logger.info("foundry: Triton's kernels are not carried in the archive: no Triton 3.4 or later here (no "
                    "triton.knobs); a LOAD on a new host compiles them")
        return False
    try:
        chosen = knobs.cache.manager_class  # reads TRITON_CACHE_MANAGER, which may name a bad class
    except Exception as exc:  # noqa: BLE001 - Triton reports the setting itself when it compiles
        logger.warning("foundry: Triton's cache is not carried in the archive: %s is unusable (%s); fix or unset it",
                       MANAGER_ENV, exc)
        return False
    manager = manager_class()
    if chosen is not None and chosen is not manager:
        logger.info("foundry: Triton's cache is not carried in the archive: %s chooses another cache manager (%s)",
                    MANAGER_ENV, getattr(chosen, "__qualname__", chosen))
        return False
    carrier.home = _own_directory(knobs)
    triton_cache_manager.set_listener(carrier)
    knobs.cache.manager_class = manager
    return True


def _own_directory(knobs: Any) -> str | None:
    """Triton's cache directory now (``TRITON_CACHE_DIR`` or its default), None when unreadable."""
    try:
        return os.path.realpath(knobs.cache.dir)
    except Exception as exc:  # noqa: BLE001 - every kernel is then carried as placed ahead
        logger.info("foundry: Triton's cache directory is unknown (%s: %s); its kernels and Inductor's are carried "
                    "alike", type(exc).__name__, exc)
        return None


def uninstall() -> None:
    """Gives Triton its default manager back (tests)."""
    triton_cache_manager.set_listener(None)
    try:
        from triton import knobs
    except ImportError:
        return
    if knobs.cache.manager_class is manager_class():
        del knobs.cache.manager_class  # back to TRITON_CACHE_MANAGER / the default


__all__ = ["CACHE", "KEY_DIR", "TritonCarrier", "current", "install", "uninstall", "written"]
