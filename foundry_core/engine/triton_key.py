"""Triton's installation key, computed ahead on a thread at LOAD.

Triton keys its on-disk kernel cache by ``triton_key()``: a SHA-256 over its compiler sources
and its ``libtriton`` binary, computed once per process (``functools.lru_cache``) at the first
launch of a kernel the process has not loaded yet. An unmodified start pays it inside its kernel
warmup; LOAD skips that warmup, so the first Triton kernel the engine runs outside its graphs
paid it at the worst place: SGLang 0.5.17's attention-metadata preparation in the decode loop,
0.31-0.36 s of that loop's 0.42 s on the H200. The hashing reads files and releases the GIL, so a
thread started while the engine loads its model takes it off the critical path, when the model
load leaves it time. A fork server computes it once after its imports (:func:`compute_now`), so a
process forked from it finds it cached and starts no thread.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from foundry_core.engine.critical_path import LEDGER

logger = logging.getLogger("foundry")

# Where Triton defines triton_key(): 3.4 and later, then the releases before.
MODULES = ("triton.runtime.cache", "triton.compiler.compiler")

_lock = threading.Lock()
_thread: threading.Thread | None = None


def _key_function() -> Callable[[], Any] | None:
    """Triton's ``triton_key`` when Triton is already imported (a thread must not import it
    while the main thread may be importing it too), else None."""
    for name in MODULES:
        function = getattr(sys.modules.get(name), "triton_key", None)
        if callable(function):
            return function
    return None


def _cached(function: Callable[[], Any]) -> bool:
    """Whether ``function`` (an ``lru_cache``) already holds its value: computed by the fork
    server this process was forked from (:func:`compute_now`)."""
    info = getattr(function, "cache_info", None)
    return callable(info) and info().currsize > 0


def _compute(function: Callable[[], Any]) -> None:
    with LEDGER.background("triton key thread cpu"):
        _compute_key(function)


def _compute_key(function: Callable[[], Any]) -> None:
    start = time.perf_counter()
    try:
        function()
    except Exception as exc:  # noqa: BLE001 - the kernel launch that needs it will say what is wrong
        logger.debug("foundry: Triton's cache key could not be computed ahead: %s", exc)
        return
    logger.debug("foundry: Triton's cache key computed ahead in %.2f s", time.perf_counter() - start)


def warm_triton_key() -> threading.Thread | None:
    """Starts, once per process, a daemon thread that computes Triton's cache key, so the first
    Triton kernel launch finds it cached. Returns that thread, or None when Triton is not imported
    yet (call again later) or a thread was started before."""
    global _thread
    with _lock:
        if _thread is not None:
            return None
        function = _key_function()
        if function is None or _cached(function):
            return None
        _thread = threading.Thread(target=_compute, args=(function,), name="foundry-triton-key", daemon=True)
        _thread.start()
        return _thread


def compute_now() -> str:
    """Computes Triton's key in this thread and says how long it took ("" when Triton is not
    imported). For the fork server after its imports: every child forked from it then finds the
    key cached, and no thread of its own has to race its model load for it (the tiny model's
    LOAD reached the decode loop 2 s after the thread started, before the thread was done)."""
    function = _key_function()
    if function is None:
        return ""
    start = time.perf_counter()
    try:
        function()
    except Exception as exc:  # noqa: BLE001 - the first kernel launch computes it and says what is wrong
        return f"Triton's cache key not computed ({type(exc).__name__}: {exc})"
    return f"Triton's cache key computed for the children in {time.perf_counter() - start:.2f} s"


def reset() -> None:
    """Forgets the thread started before (tests)."""
    global _thread
    with _lock:
        _thread = None
