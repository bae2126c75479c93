"""SGLang's scheduler and detokenizer forked from a process that has already imported SGLang
(foundry-core's fork server, :mod:`foundry_core.engine.fork_server.client`).

SGLang spawns its children: each execs a fresh interpreter that imports SGLang again before it
does any work (about 30 s for the scheduler on the GPU host, on the critical path of every start).
With Foundry active, :func:`start_early` (run by foundry-core's start-up hook through the
``foundry.early_start`` entry point) starts the fork server, which imports SGLang's scheduler and
detokenizer modules (``fork_server_preload.py``) while the main process imports its own. SGLang's
two launch sites then fork their children from it (``fork_patches.py``).

``FOUNDRY_SGLANG_FORK_SERVER=0`` turns the fork server off (SGLang spawns, as without Foundry).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from foundry_core.engine import triton_at_import
from foundry_core.engine.fork_server import client
from foundry_core.engine.options import env_flag

SWITCH_ENV = "FOUNDRY_SGLANG_FORK_SERVER"
PRELOAD_MODULE = "sglang_foundry.fork_server_preload"
# The commands that start SGLang's server: ``python -m sglang.launch_server`` and ``sglang serve``.
SERVER_MODULES = ("sglang.launch_server",)
# What the log calls SGLang's children, by their target's name.
CHILD_NAMES = {"run_scheduler_process": "scheduler", "run_detokenizer_process": "detokenizer"}


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the fork server is wanted (default yes; ``FOUNDRY_SGLANG_FORK_SERVER=0`` says no)."""
    return env_flag(SWITCH_ENV, True, environ)


def starts_server(orig_argv: Sequence[str]) -> bool:
    """Whether the interpreter's command line starts SGLang's server."""
    args = list(orig_argv[1:])
    for i, arg in enumerate(args):
        if arg == "-m":
            return i + 1 < len(args) and args[i + 1] in SERVER_MODULES
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:] in SERVER_MODULES
        if not arg.startswith("-"):  # a script: the `sglang` console script with `serve`
            return os.path.basename(arg) == "sglang" and i + 1 < len(args) and args[i + 1] == "serve"
    return False


def start_early() -> bool:
    """The ``foundry.early_start`` entry point: starts the fork server when this process starts
    SGLang's server with Foundry active (the start-up hook checked that) and the switch allows it;
    returns whether it did (the main process, which never runs a model, is then not restarted
    under the preload). Never raises: SGLang then spawns, as it does without the fork server."""
    return client.start_early("SGLang", lambda: enabled() and starts_server(getattr(sys, "orig_argv", [])),
                              lambda: start(), "SGLang's children")


def start(preload: Sequence[str] = (PRELOAD_MODULE,)) -> str:
    """Starts the fork server importing ``preload``, told the archive a LOAD would place Triton's
    modules built at import from (:mod:`foundry_core.engine.triton_at_import`: SGLang's imports
    build one); returns its status file."""
    return client.start(preload, "SGLang", CHILD_NAMES,
                        environ=triton_at_import.fork_server_environ(getattr(sys, "orig_argv", sys.argv), os.environ))
