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
- When FOUNDRY_ARCHIVE / FOUNDRY_MODE make Foundry active (set by the user for
  ``sglang.Engine(...)``, or exported by the flags in the main process and inherited by the
  children): ``activate()``: the child environment (libfoundry.so in ``LD_PRELOAD``, the NCCL
  settings, the FOUNDRY_* variables, ``FOUNDRY_STRICT=1`` unless set), logging for the ``foundry``
  logger, and, in scheduler processes (``hosts_scheduler()``), the worker and capture seams.

**No start-method change.** SGLang spawns its children: ``_set_envs_and_config``
(``srt/entrypoints/engine.py``, 0.5.17 :1574) calls ``mp.set_start_method("spawn", force=True)``
(:1670) in the main process just before ``_launch_scheduler_processes`` starts one
``mp.Process(run_scheduler_process)`` per rank, and a spawned child passes the start method on to
its own children (the DP controller's schedulers). A spawned child execs a fresh interpreter with
the main process's ``os.environ``, so the ``LD_PRELOAD`` set here reaches every scheduler; nothing
has to be patched at the spawn sites.

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

import logging
import multiprocessing

from foundry_core.engine import Settings, prepare_child_environment, resolve_settings
from foundry_core.engine.environment import STRICT_ENV, plugin_child_environment
from foundry_core.engine.logs import LOG_ENV, setup_logging
from foundry_core.engine.registration import PluginRegistration
from foundry_core.errors import FoundryError

from sglang_foundry import capture_patches, cli, modes, worker_patches

logger = logging.getLogger("foundry.sglang")

# Spawn targets of SGLang's processes that never run a model (0.5.17 and 0.5.23).
NON_SCHEDULER_TARGETS = ("run_detokenizer_process", "run_data_parallel_controller_process",
                         "run_multi_detokenizer_router_process")

__all__ = ["register", "activate", "setup_logging", "child_environment", "hosts_scheduler", "NON_SCHEDULER_TARGETS",
           "resolve_settings", "STRICT_ENV", "LOG_ENV"]

_REGISTRATION = PluginRegistration("sglang-foundry", logger)


def register() -> None:
    """The plugin entry point; safe to call any number of times in any process. In a scheduler a
    failed activation ends the process (SystemExit with the message), see the module docstring."""
    _REGISTRATION.register(lambda: cli.install(strict=False), lambda settings: activate(settings),
                           on_error=_exit_in_scheduler)


def _exit_in_scheduler(exc: FoundryError) -> None:
    if hosts_scheduler():
        logger.error("foundry: %s", exc)
        raise SystemExit(f"sglang-foundry: {exc}") from exc


def child_environment(settings: Settings) -> dict[str, str]:
    """This process's environment as SGLang's children must inherit it."""
    return plugin_child_environment(settings, plugin="sglang-foundry", off_hint=modes.OFF_HINT,
                                    prepare=prepare_child_environment)


def hosts_scheduler() -> bool:
    """Whether this process may run an SGLang scheduler (and so a model runner): a process started
    by multiprocessing whose target is not one of SGLang's model-free processes. The main process
    never runs one (SGLang always starts its schedulers as children) and is spared importing the
    model-runner modules."""
    if multiprocessing.parent_process() is None:
        return False
    target = getattr(multiprocessing.current_process(), "_target", None)
    return getattr(target, "__name__", "") not in NON_SCHEDULER_TARGETS


def activate(settings: Settings) -> None:
    """Makes Foundry active in this process (idempotent): environment, logging, and the worker
    and capture seams in a scheduler."""
    _REGISTRATION.activate(settings, child_environment, _install_seams_here)


def _install_seams_here() -> None:
    if hosts_scheduler():
        worker_patches.install()
        capture_patches.install()


def _reset_for_tests() -> None:
    _REGISTRATION.reset()
