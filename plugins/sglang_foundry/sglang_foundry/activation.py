"""Foundry made active in one SGLang process: ``activate(settings)``.

Both ways in reach it: the entry point (register.py), when FOUNDRY_ARCHIVE / FOUNDRY_MODE make
Foundry active (set by the user for ``sglang.Engine(...)``, or exported by the flags in the main
process and inherited by the children), and the CLI seam (cli.py), when the flags arrive after the
entry point ran. It sets the child environment (libfoundry.so in ``LD_PRELOAD``, the NCCL settings,
the FOUNDRY_* variables, ``FOUNDRY_STRICT=1`` unless set), logging for the ``foundry`` logger, and,
in scheduler processes (:func:`hosts_scheduler`), the worker and capture seams; in the main process,
when it started a fork server, the launch seams that fork SGLang's children from it.
"""

from __future__ import annotations

import logging
import multiprocessing

from foundry_core.engine import Settings, prepare_child_environment
from foundry_core.engine.environment import plugin_child_environment
from foundry_core.engine.registration import PluginRegistration

from sglang_foundry import modes

logger = logging.getLogger("foundry.sglang")

__all__ = ["REGISTRATION", "NON_SCHEDULER_TARGETS", "activate", "child_environment", "hosts_scheduler"]

# Spawn targets of SGLang's processes that never run a model (0.5.17 and 0.5.23).
NON_SCHEDULER_TARGETS = ("run_detokenizer_process", "run_data_parallel_controller_process",
                         "run_multi_detokenizer_router_process")

# This process's registration: the entry point's and activate()'s state, kept in one place.
REGISTRATION = PluginRegistration("sglang-foundry", logger)


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
    """Makes Foundry active in this process (idempotent): environment, logging, the worker and
    capture seams in a scheduler, the launch seams in a main process that started a fork server."""
    REGISTRATION.activate(settings, child_environment, _install_seams_here)


def _install_seams_here() -> None:
    # Each process imports only its own seams: the main process, on the start's critical path, is
    # spared the scheduler's (the fork server imports those before it forks a scheduler).
    if hosts_scheduler():
        from sglang_foundry import capture_patches, prefill_patches, worker_patches

        worker_patches.install()
        capture_patches.install()
        prefill_patches.install()
    elif multiprocessing.parent_process() is None:
        from sglang_foundry import fork_patches

        fork_patches.install()  # the main process: its children forked from the fork server


def _reset_for_tests() -> None:
    REGISTRATION.reset()
