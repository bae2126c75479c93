"""The ``vllm.general_plugins`` entry point: ``register()``, called once in every vLLM process.

vLLM calls it in process 0 (before parsing argv, and again from ``EngineArgs.__post_init__``; its
own ``plugins_loaded`` flag makes that once), in every EngineCore process and in every worker
(``WorkerWrapperBase.init_worker``, before the worker class is resolved). It must be idempotent and
cheap when Foundry is off.

- In the first process (vLLM's children never parse a command line): wraps
  ``EngineArgs.add_cli_args`` / ``from_cli_args`` for ``--foundry-archive`` /
  ``--foundry-mode`` (cli.py); if vLLM moved them, a warning says the flags are unavailable and the
  environment variables still work.
- When FOUNDRY_ARCHIVE / FOUNDRY_MODE make Foundry active: ``activate()`` (activation.py: the
  child environment, logging, and the worker and capture seams where a worker may run).

This module is the top of the plugin: it imports the CLI seam and the activation, and nothing
imports it but the package.
"""

from __future__ import annotations

import multiprocessing
import time

_IMPORT_STARTED = time.perf_counter()  # before the imports below: the plugin's import counts on the critical path

from foundry_core.engine import critical_path, resolve_settings
from foundry_core.engine.environment import STRICT_ENV
from foundry_core.engine.logs import LOG_ENV, setup_logging

from vllm_foundry import activation, cli
from vllm_foundry.activation import (INPROC_ENV, MP_METHOD_ENV, activate, child_environment, hosts_engine,
                                     install_engine_seams)

__all__ = ["register", "activate", "setup_logging", "child_environment", "hosts_engine", "install_engine_seams",
           "resolve_settings", "MP_METHOD_ENV", "STRICT_ENV", "LOG_ENV", "INPROC_ENV"]


_IMPORTED = critical_path.import_time(_IMPORT_STARTED)


def register() -> None:
    """The plugin entry point; safe to call any number of times in any process."""
    activation.REGISTRATION.register(_install_cli, lambda settings: activation.activate(settings),
                                     imported_s=_IMPORTED.here())


def _install_cli() -> None:
    """The CLI wrappers, in the first process only: vLLM's children (engine cores, workers, more
    API servers) get their configuration from it, never from a command line, and the flags reach
    them through the environment it exported. Wrapping ``EngineArgs`` in an engine core would
    import ``vllm.engine.arg_utils``, which the engine core itself never imports (0.06 s of its
    critical path on the H200 host)."""
    if multiprocessing.parent_process() is None:
        cli.install(strict=False)
