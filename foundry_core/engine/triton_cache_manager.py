"""The Triton cache manager that reports each key directory to this process's listener, the
:class:`~foundry_core.engine.triton_cache.TritonCarrier` (see :mod:`foundry_core.engine.triton_cache`,
which sets it).

Built on first use: it subclasses Triton's ``FileCacheManager``, and importing Triton is left to
the process that has it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Protocol

logger = logging.getLogger("foundry")

__all__ = ["KeyListener", "listener", "set_listener", "manager_class"]


class KeyListener(Protocol):
    """Hears of each key directory the manager opens (the carrier)."""

    def looked_up(self, key: str, directory: str) -> object: ...  # its answer is not used here


_listener: KeyListener | None = None


def listener() -> KeyListener | None:
    """Who hears of this process's key directories (None: nobody, Triton's cache is not carried)."""
    return _listener


def set_listener(new: KeyListener | None) -> None:
    """Makes ``new`` hear of every key directory opened from now on (None: nobody)."""
    global _listener
    _listener = new


@functools.cache
def manager_class() -> type:
    from triton.runtime.cache import FileCacheManager

    class CarriedCacheManager(FileCacheManager):  # type: ignore[misc, valid-type]
        """Triton's file cache; the carrier hears of each key directory opened (not the dump and
        override directories). A carrier's failure never fails Triton: it compiles instead."""

        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            super().__init__(key, override=override, dump=dump)
            carrier = listener()
            directory: Any = getattr(self, "cache_dir", None)
            if carrier is None or override or dump or not directory:
                return
            try:
                carrier.looked_up(self.key, directory)
            except Exception as exc:  # noqa: BLE001 - a kernel cache must not stop the engine
                logger.warning("foundry: Triton cache entry %s not carried or restored (%s); Triton compiles it as "
                               "usual", self.key, exc)

    return CarriedCacheManager
