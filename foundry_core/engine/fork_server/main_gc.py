"""The main process's garbage collector paused while the engine imports itself at start-up.

An engine's first process imports the engine (torch, transformers, the server's modules: 20-30 s
on the GPU host) before it launches its GPU processes. Every full collection over those imports
walks the whole heap built so far, and the number of full collections grows with the heap, so
they add up (1.6 s of them over SGLang's imports in the fork server on the H200 host, which found
a few hundred objects). The early start that started a fork server (and so knows this process is
the engine's server) pauses the collector (:func:`pause`); the engine's first launch of a GPU
process through the fork server, when the imports are done, resumes it (:func:`resume`), with the
import heap frozen (``gc.freeze()``: left out of later collections, as vLLM and SGLang do after
their own start-ups).

Nothing may leave the collector off for good:

- a bound (:data:`BOUND_S`): a daemon timer resumes it if no launch came by then (an engine that
  spawns its GPU processes after all, or fails before it launches any);
- a child forked while it is paused gets it back on (``os.register_at_fork``);
- ``FOUNDRY_FORK_GC_FREEZE=0`` (the fork server's switch) leaves it as it is.

This module imports only the standard library: the early start runs it at interpreter start-up.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time

logger = logging.getLogger("foundry.fork_server")

__all__ = ["BOUND_S", "pause", "paused", "resume"]

BOUND_S = 180.0  # the longest pause: well past an engine's imports (20-40 s on the GPU host)


class _Pause:
    """This process's pause: when it began and the timer that ends it at the latest."""

    def __init__(self) -> None:
        self.began: float | None = None  # None: not paused (a forked child starts unpaused)
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()


_PAUSE = _Pause()
_at_fork_registered = False


def paused() -> bool:
    """Whether this process's collector is paused by :func:`pause`."""
    return _PAUSE.began is not None


def pause(bound_s: float = BOUND_S) -> bool:
    """Turns the collector off until :func:`resume` or ``bound_s`` seconds; False (nothing done)
    when it is off already (the engine's or the user's choice, left alone) or paused."""
    global _at_fork_registered
    with _PAUSE.lock:
        if not gc.isenabled() or paused():
            return False
        if not _at_fork_registered:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _at_fork_registered = True
        timer = threading.Timer(bound_s, resume, args=(f"no launch within {bound_s:.0f} s",))
        timer.daemon = True
        timer.name = "foundry-gc-pause"
        timer.start()  # first: a timer that cannot start leaves the collector on
        gc.disable()
        _PAUSE.began, _PAUSE.timer = time.perf_counter(), timer
        return True


def resume(why: str, freeze: bool = True) -> float | None:
    """Ends the pause (``why``, for the log), the import heap frozen first when ``freeze``;
    returns the seconds it lasted, or None when nothing was paused. Safe from any thread, and
    more than once."""
    with _PAUSE.lock:
        if not paused():
            return None
        seconds = time.perf_counter() - (_PAUSE.began or 0.0)
        timer, _PAUSE.began, _PAUSE.timer = _PAUSE.timer, None, None
        if freeze:
            gc.freeze()
        gc.enable()
    if timer is not None and timer is not threading.current_thread():
        timer.cancel()
    logger.info("foundry: garbage collection resumed in the main process (%s) after %.1f s paused over the "
                "engine's imports%s", why, seconds, ", the import heap frozen" if freeze else "")
    return seconds


def _after_fork_in_child() -> None:
    # The timer thread is not in the child, and the lock may have been held by a parent's thread.
    _PAUSE.lock = threading.Lock()
    if _PAUSE.began is not None:
        _PAUSE.began, _PAUSE.timer = None, None
        gc.enable()  # the collector must not stay off there
