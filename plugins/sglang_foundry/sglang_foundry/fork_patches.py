"""SGLang's two launch sites start their children through the fork server (``fork_server.py``).

``Engine._launch_scheduler_processes`` and ``Engine._launch_detokenizer_subprocesses`` create
``mp.Process`` objects through the ``multiprocessing`` module that ``srt/entrypoints/engine.py``
imported as ``mp``. For the duration of each call that name is SGLang's engine module's view of
multiprocessing in which ``Process`` is foundry-core's ``ForkedProcess`` (each child forked, or
spawned where ``spawn_reason`` says so); every other name, and every other caller, is untouched.
Installed in the main process only, and only when this process started a fork server.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from foundry_core.engine.fork_server import client

from sglang_foundry import patching
from sglang_foundry.seams import seam

LAUNCH_SEAMS = ("process.launch_schedulers", "process.launch_detokenizers")
MP_SEAM = "process.engine_mp"


def install() -> bool:
    """Wraps the launch sites when a fork server runs; returns whether it did."""
    if not client.running():
        return False
    for name in LAUNCH_SEAMS:
        patching.install(name, _forking)
    return True


def _forking(original: Callable[..., Any]) -> Callable[..., Any]:
    def launch(cls, *args: Any, **kwargs: Any) -> Any:
        module = sys.modules[seam(MP_SEAM).module]
        saved = module.mp
        module.mp = client.ForkingMultiprocessing(saved)
        try:
            return original(cls, *args, **kwargs)
        finally:
            module.mp = saved

    return launch
