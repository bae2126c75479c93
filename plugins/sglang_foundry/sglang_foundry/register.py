"""The ``sglang.srt.plugins`` entry point: ``register()``, called once in every SGLang process
that loads plugins.

SGLang calls ``load_plugins()`` (idempotent per process) in the main process (``launch_server``,
``sglang serve``, ``sglang.Engine.__init__``, again in ``_launch_subprocesses``) and as the first
line of every scheduler process (``run_scheduler_process``); 0.5.23 also in the DP controller and
the detokenizer. So register() must be idempotent, cheap when Foundry is off, and must tell the
processes apart.

- Always: wraps ``ServerArgs.add_cli_args`` / ``from_cli_args`` for ``--foundry-archive`` /
  ``--foundry-mode`` (cli.py); if SGLang moved them, a warning says the flags are unavailable and
  the environment variables still work.
- When FOUNDRY_ARCHIVE / FOUNDRY_MODE make Foundry active: ``activate()`` (activation.py: the
  child environment, logging, and in scheduler processes the worker and capture seams).

**The start method stays SGLang's.** SGLang spawns its children: ``_set_envs_and_config``
(``srt/entrypoints/engine.py``, 0.5.17 :1574) calls ``mp.set_start_method("spawn", force=True)``
(:1670) in the main process just before ``_launch_scheduler_processes`` starts one
``mp.Process(run_scheduler_process)`` per rank, and a spawned child passes the start method on to
its own children (the DP controller's schedulers). A spawned child execs a fresh interpreter with
the main process's ``os.environ``, so the ``LD_PRELOAD`` set here reaches every scheduler. When
the start-up hook started the fork server (fork_server.py), the two launch sites fork the
scheduler and the detokenizer from it instead, under the same environment (fork_patches.py).

**Why our Patcher, not SGLang's HookRegistry.** SGLang's ``HookRegistry`` could wrap the same
methods, but (1) one declarative seam table (``seams.py``) then drives both the patching and the
contract checks against release sources, as for vLLM, with SeamErrors naming the seam and the
version; (2) the registry applies hooks only after every plugin has run (``apply_hooks`` at the end
of ``load_plugins``) and imports each target module to resolve it, while the CLI wrappers must be
in place before argv is parsed and the worker seams only in schedulers; (3) its
``_propagate_patch`` rewrite of ``from X import Y`` bindings is not needed: every wrapped seam is a
method or a function looked up through its module at call time (``seams.py`` checks that).

**Failures.** ``load_plugins`` logs and swallows a plugin's exceptions. In a scheduler that would
mean a start without Foundry although the user asked for it, so there a failed activation (no
libfoundry.so, a bad FOUNDRY_MODE, a moved seam) ends the process with SystemExit and the message;
SGLang's main process then reports the scheduler's death.
"""

from __future__ import annotations

import time

_IMPORT_STARTED = time.perf_counter()  # before the imports below: the plugin's import counts on the critical path

import logging

from foundry_core.engine import critical_path, resolve_settings
from foundry_core.engine.environment import STRICT_ENV
from foundry_core.engine.logs import LOG_ENV, setup_logging
from foundry_core.errors import FoundryError

from sglang_foundry import activation, cli
from sglang_foundry.activation import NON_SCHEDULER_TARGETS, activate, child_environment, hosts_scheduler

logger = logging.getLogger("foundry.sglang")

__all__ = ["register", "activate", "setup_logging", "child_environment", "hosts_scheduler", "NON_SCHEDULER_TARGETS",
           "resolve_settings", "STRICT_ENV", "LOG_ENV"]


_IMPORTED = critical_path.import_time(_IMPORT_STARTED)


def register() -> None:
    """The plugin entry point; safe to call any number of times in any process. In a scheduler a
    failed activation ends the process (SystemExit with the message), see the module docstring."""
    activation.REGISTRATION.register(lambda: cli.install(strict=False), lambda settings: activation.activate(settings),
                                     on_error=_exit_in_scheduler, imported_s=_IMPORTED.here())


def _exit_in_scheduler(exc: FoundryError) -> None:
    if activation.hosts_scheduler():
        logger.error("foundry: %s", exc)
        raise SystemExit(f"sglang-foundry: {exc}") from exc
