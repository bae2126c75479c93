"""vLLM's engine core forked from a process that has already imported vLLM's engine half
(foundry-core's fork server, :mod:`foundry_core.engine.fork_server.client`).

``vllm serve`` spawns its engine core (``VLLM_WORKER_MULTIPROC_METHOD=spawn``, set by vLLM's
CLI): the child execs a fresh interpreter that imports torch and vLLM's engine, model runner and
worker modules before its first line (about 22 s of an 8B start on the H200 host, on the critical
path of every start). With Foundry active, :func:`start_early` (run by foundry-core's start-up hook through the
``foundry.early_start`` entry point) starts the fork server, which imports those modules
(``fork_server_preload.py``) while the API server imports its own. vLLM's engine-core launch then
forks the engine core from it (``fork_patches.py``).

Only the engine cores (one per data-parallel rank): the workers of tensor parallel run under
``MultiprocExecutor``, which the engine core starts as vLLM does (spawned). ``FOUNDRY_VLLM_FORK_SERVER=0`` turns the fork server
off (vLLM spawns, as without Foundry).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from foundry_core.autopreload import flag_value
from foundry_core.engine.fork_server import client
from foundry_core.engine.options import env_flag

SWITCH_ENV = "FOUNDRY_VLLM_FORK_SERVER"
INPROC_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
PRELOAD_MODULE = "vllm_foundry.fork_server_preload"
# The commands that start vLLM's OpenAI server: ``vllm serve`` (the console script, or
# ``python -m vllm.entrypoints.cli.main serve``) and ``python -m vllm.entrypoints.openai.api_server``.
SERVE_MODULES = ("vllm.entrypoints.cli.main",)
SERVER_MODULES = ("vllm.entrypoints.openai.api_server",)
# What the log calls vLLM's children, by their target's name.
CHILD_NAMES = {"run_engine_core": "engine core"}


def starts_server(orig_argv: Sequence[str]) -> bool:
    """Whether the interpreter's command line starts vLLM's OpenAI server."""
    args = list(orig_argv[1:])
    for i, arg in enumerate(args):
        module = args[i + 1] if arg == "-m" and i + 1 < len(args) else arg[2:] if arg.startswith("-m") else None
        if module is not None:
            rest = args[i + 2:] if arg == "-m" else args[i + 1:]
            return module in SERVER_MODULES or (module in SERVE_MODULES and rest[:1] == ["serve"])
        if not arg.startswith("-"):  # a script: the `vllm` console script with `serve`
            return os.path.basename(arg) == "vllm" and args[i + 1:i + 2] == ["serve"]
    return False


def engine_in_children(environ: Mapping[str, str] | None = None, argv: Sequence[str] = ()) -> bool:
    """Whether vLLM runs its engine in child processes: ``VLLM_ENABLE_V1_MULTIPROCESSING`` not
    off (read as vLLM reads it, ``bool(int(value))``; a value it cannot read counts as on, and vLLM
    refuses it), and ``argv`` not asking for ``--distributed-executor-backend external_launcher``
    (vLLM then turns multiprocessing off itself, ``config/parallel.py``). Otherwise the API server
    runs the engine and needs the preload, which a restart gives it."""
    env = os.environ if environ is None else environ
    try:
        on = bool(int(env.get(INPROC_ENV, "1")))
    except ValueError:
        on = True
    return on and flag_value(argv, "--distributed-executor-backend") != "external_launcher"


def start_early() -> bool:
    """The ``foundry.early_start`` entry point: starts the fork server when this process starts
    vLLM's server with Foundry active (the start-up hook checked that), its engine runs in child
    processes and the switch allows it; returns whether it did (the API server is then not
    restarted under the preload: it runs no GPU work). Never raises: vLLM then spawns, as it does
    without the fork server."""
    argv = getattr(sys, "orig_argv", [])
    return client.start_early("vLLM", lambda: env_flag(SWITCH_ENV) and engine_in_children(argv=argv)
                              and starts_server(argv), lambda: start(), "vLLM's engine core")


def start(preload: Sequence[str] = (PRELOAD_MODULE,)) -> str:
    """Starts the fork server importing ``preload``; returns its status file."""
    return client.start(preload, "vLLM", CHILD_NAMES)
