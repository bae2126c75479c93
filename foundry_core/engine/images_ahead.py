"""LOAD: the archive's kernel images handed to the driver on a thread, ahead of the restore.

Loading the images is the restore's largest cost after instantiation: 0.09-0.12 s of vLLM's
0.41-0.46 s restore of 51 decode graphs with Qwen3-8B shapes on the H200, 0.07-0.08 s of
SGLang's 0.15 s. It needs only the CUDA context and the archive's files, nothing the engine
allocates. So once a rank knows it loads (the determinism boundary, after NCCL), a thread loads
them while the engine loads its weights, and the restore finds them loaded (it reads and checks
each file again, but does not hand it to the driver again).

The engine and the restored graphs must share one copy of each module (its ``__device__`` and
``__constant__`` state): an identical image the engine loads after the thread loaded it gets the
archived module; one it loaded before, or while the thread loaded it, is its own copy, and the
registry resolves restored kernels to the process's own copy first.

An error on the thread is not raised: the restore loads the same directory again and meets the
same problem itself, where the session's fallback policy handles it. The session joins the thread
at the restore, at a fallback or at its end, whichever comes first. Not started for lazy
instantiation (which loads an image only when a graph needs it). ``FOUNDRY_IMAGES_AHEAD=0`` turns
this off (the restore loads the images, as before).

With ``FOUNDRY_EXEC_WARMUP=1`` the thread then grows the driver's device memory for graph execs
(:mod:`foundry_core.exec_memory`): the share of the restore's instantiation that is the driver
obtaining memory for each live exec. The restore does not wait for that work: it asks it to stop
(after the stand-in under way) and joins. A failure there is logged, and the restore
instantiates as it would have.

On the start's critical path (:mod:`foundry_core.engine.critical_path`) is only what
:meth:`ImagesAhead.wait` waits (``images wait``); the thread's CPU time is shown beside it
(``images thread cpu``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from foundry_core.engine.critical_path import LEDGER

logger = logging.getLogger("foundry")

IMAGES_AHEAD_ENV = "FOUNDRY_IMAGES_AHEAD"
EXEC_WARMUP_ENV = "FOUNDRY_EXEC_WARMUP"


class ImagesAhead:
    """One thread that runs ``bind()`` (makes the engine's CUDA device current there), ``load()``
    (hands the images to the driver) and then, when given and the load went well, ``then()``
    (optional work that needs the images or only the context); :meth:`wait` calls ``stop_then()``
    (which asks ``then`` to finish early) and joins the thread."""

    def __init__(self, load: Callable[[], object], bind: Callable[[], None],
                 then: Callable[[], object] | None = None, stop_then: Callable[[], None] | None = None) -> None:
        self._load = load
        self._bind = bind
        self._then = then
        self._stop_then = stop_then
        self._thread = threading.Thread(target=self._run, name="foundry-images-ahead", daemon=True)
        self.seconds: float | None = None  # how long the load took on the thread, once done
        self.error: BaseException | None = None
        self.then_error: BaseException | None = None

    def start(self) -> ImagesAhead:
        self._thread.start()
        return self

    def _run(self) -> None:
        with LEDGER.background("images thread cpu"):
            self._work()

    def _work(self) -> None:
        start = time.perf_counter()
        try:
            self._bind()
            self._load()
        except BaseException as exc:  # noqa: BLE001 - kept for wait(); the restore meets it again
            self.error = exc
        self.seconds = time.perf_counter() - start
        if self.error is None and self._then is not None:
            try:
                self._then()
            except BaseException as exc:  # noqa: BLE001 - kept for wait(); only an optimisation is lost
                self.then_error = exc

    def wait(self) -> float:
        """Joins the thread; returns the seconds this call waited. Logs how the load went."""
        start = time.perf_counter()
        with LEDGER.timed("images wait"):
            if self._stop_then is not None:
                self._stop_then()
            self._thread.join()
        waited = time.perf_counter() - start
        if self.error is not None:
            logger.warning("foundry: loading the kernel images ahead failed (%s: %s); the restore loads them",
                           type(self.error).__name__, self.error)
        else:
            logger.info("foundry: kernel images loaded ahead on a thread in %.2f s (the restore waited %.2f s)",
                        self.seconds or 0.0, waited)
        if self.then_error is not None:
            logger.warning("foundry: the work after loading the images ahead failed (%s: %s); the restore goes on "
                           "without it", type(self.then_error).__name__, self.then_error)
        return waited
