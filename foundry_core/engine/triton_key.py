"""Triton's installation key, computed ahead on a thread at LOAD.

Triton keys its on-disk kernel cache by ``triton_key()``: a SHA-256 over its compiler sources
and its ``libtriton`` binary, computed once per process (``functools.lru_cache``) at the first
launch of a kernel the process has not loaded yet. An unmodified start pays it inside its kernel
warmup; LOAD skips that warmup, so the first Triton kernel the engine runs outside its graphs
paid it at the worst place: SGLang 0.5.17's attention-metadata preparation in the decode loop,
0.31-0.36 s of that loop's 0.42 s on the H200. The hashing reads files and releases the GIL, so a
thread started while the engine loads its model takes it off the critical path. Where the model
loads faster than the thread hashes (a small model), the first launch would compute the key again
beside the thread (``lru_cache`` does not wait for a call in flight); :func:`wait_triton_key`
before that launch waits for the thread's rest instead.
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
_function: Callable[[], Any] | None = None  # what the thread computes (an lru_cache'd function)
# The longest wait for the thread: past it the launch hashes for itself, as without the thread.
WAIT_LIMIT_S = 30.0


def _key_function() -> Callable[[], Any] | None:
    """Triton's ``triton_key`` when Triton is already imported (a thread must not import it
    while the main thread may be importing it too), else None."""
    for name in MODULES:
        function = getattr(sys.modules.get(name), "triton_key", None)
        if callable(function):
            return function
    return None


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
    global _thread, _function
    with _lock:
        if _thread is not None:
            return None
        function = _key_function()
        if function is None:
            return None
        _thread = threading.Thread(target=_compute, args=(function,), name="foundry-triton-key", daemon=True)
        _function = function
        _thread.start()
        return _thread


def wait_triton_key(limit_s: float = WAIT_LIMIT_S) -> float:
    """Waits for the thread :func:`warm_triton_key` started, if it is still hashing and the key is
    not cached already, for at most ``limit_s``; returns the seconds waited (0.0 when it did not
    wait). Call it just before the engine's first Triton launch: the rest of the thread's hash is
    shorter than a second hash from the start. The wait is the engine's own work done earlier (its
    warmup computes the key), so the ledger shows it beside the critical path, not in it."""
    with _lock:
        thread, function = _thread, _function
    if thread is None or not thread.is_alive() or _cached(function):
        return 0.0
    start = time.perf_counter()
    with LEDGER.engine_work("triton key wait"):
        thread.join(limit_s)
    waited = time.perf_counter() - start
    if thread.is_alive():
        logger.info("foundry: Triton's cache key thread still runs after %.0f s; the engine computes the key itself",
                    waited)
    else:
        logger.info("foundry: waited %.2f s for Triton's cache key (computed ahead on a thread)", waited)
    return waited


def _cached(function: Callable[[], Any] | None) -> bool:
    """Whether ``function`` (an lru_cache'd ``triton_key``) has its value already: computed by
    another caller, the thread's hash is a second one, not worth waiting for."""
    info = getattr(function, "cache_info", None)
    try:
        return bool(info is not None and info().currsize)
    except Exception:  # noqa: BLE001 - not an lru_cache: wait as for any thread
        return False


def reset() -> None:
    """Forgets the thread started before (tests)."""
    global _thread, _function
    with _lock:
        _thread = _function = None
