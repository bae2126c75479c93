"""vLLM's engine-core launch starts the engine core through the fork server (``fork_server.py``).

``CoreEngineProcManager.__init__`` (``v1/engine/utils.py``) asks ``get_mp_context()`` for the
multiprocessing context (spawn, under ``vllm serve``) and creates one ``context.Process`` per
engine core. For the duration of that call the module's ``get_mp_context`` gives foundry-core's
forking view of that context, whose ``Process`` forks each engine core from the fork server (or
spawns it where ``spawn_reason`` says so); every other caller of ``get_mp_context`` (the
executors' workers) is untouched. Installed in the API server only, and only when this process
started a fork server. Where the installed vLLM lacks either seam, the engine core is spawned, as
without the fork server, and a warning says why.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from foundry_core.engine.fork_server import client, main_gc

from vllm_foundry import patching
from vllm_foundry.seams import seam

logger = logging.getLogger("foundry.vllm")

LAUNCH_SEAM = "process.engine_core_launch"
CONTEXT_SEAM = "process.engine_core_mp_context"


def install() -> bool:
    """Wraps the engine-core launch when a fork server runs; returns whether it did."""
    if not client.running():
        return False
    try:
        patching.resolve(seam(CONTEXT_SEAM))  # the wrapper swaps it at every launch
        patching.install(LAUNCH_SEAM, _forking)
    except patching.SeamError as exc:
        logger.warning("foundry: vLLM's engine core is spawned, not forked from the fork server: %s", exc)
        main_gc.resume("no launch through the fork server")  # none would end the pause
        return False
    return True


def _forking(original: Callable[..., Any]) -> Callable[..., Any]:
    def launch(self, *args: Any, **kwargs: Any) -> Any:
        module = sys.modules[seam(CONTEXT_SEAM).module]
        saved = module.get_mp_context
        module.get_mp_context = lambda: client.ForkingMultiprocessing(saved())
        try:
            return original(self, *args, **kwargs)
        finally:
            module.get_mp_context = saved

    return launch
