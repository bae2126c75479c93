"""Foundry made active in one vLLM process: ``activate(settings)``.

Both ways in reach it: the entry point (register.py), when FOUNDRY_ARCHIVE / FOUNDRY_MODE make
Foundry active (set by the user for the offline ``LLM(...)`` API, or exported by the flags in
process 0 and inherited by the children), and the CLI seam (cli.py), when the flags arrive after
the entry point ran. It sets the child environment (libfoundry.so in ``LD_PRELOAD``, the NCCL
settings, the FOUNDRY_* variables, ``FOUNDRY_STRICT=1`` unless set),
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` (a forked child would not exec with the preload; left alone
when this process already runs under it, e.g. ``foundry run -- vllm serve ...`` or a script that
foundry-core's start-up hook restarted; ``vllm serve`` sets spawn itself), logging for the ``foundry`` logger, and the worker and capture seams: at once in
processes that may run a GPU worker (:func:`hosts_engine`), or in the child right after a fork
when this process has the preload (vLLM's forked engine process does not load plugins again). In
the first process, when the start-up hook started a fork server, vLLM's engine-core launch forks
the engine core from it (fork_patches.py).
"""

from __future__ import annotations

import logging
import os

from foundry_core.engine import Mode, Settings, host_caches, preload_active, prepare_child_environment
from foundry_core.engine.environment import plugin_child_environment
from foundry_core.engine.registration import PluginRegistration

from vllm_foundry import compile_artifact, compile_cache, fork_patches, fork_server, modes, piecewise
from vllm_foundry.fork_server import INPROC_ENV

logger = logging.getLogger("foundry.vllm")

__all__ = ["REGISTRATION", "MP_METHOD_ENV", "INPROC_ENV", "activate", "child_environment", "hosts_engine",
           "install_engine_seams"]

MP_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"

# This process's registration: the entry point's and activate()'s state, kept in one place.
REGISTRATION = PluginRegistration("vllm-foundry", logger)


def child_environment(settings: Settings) -> dict[str, str]:
    """This process's environment as vLLM's children must inherit it."""
    env = plugin_child_environment(settings, plugin="vllm-foundry", off_hint=modes.OFF_HINT,
                                   prepare=prepare_child_environment)
    if compile_artifact.whole_artifact_wanted(env, compile_artifact.installed_torch_version()):
        logger.info("foundry: %s=1 (vLLM loads its compiled model whole at LOAD; set it to 0 to keep vLLM's default)",
                    compile_artifact.MEGA_AOT_ENV)
        env[compile_artifact.MEGA_AOT_ENV] = "1"
    method = env.get(MP_METHOD_ENV)
    if preload_active():
        # Started under the preload (`foundry run -- vllm ...`): a forked child is a copy of this
        # process, preload included, and skips spawn's second import of vLLM (~15 s).
        return env
    if method != "spawn":
        if method:
            logger.info("foundry: %s=%s becomes spawn (a forked worker would not start with the preload)",
                        MP_METHOD_ENV, method)
        env[MP_METHOD_ENV] = "spawn"
    return env


def hosts_engine() -> bool:
    """Whether a GPU worker may run in this process: a process vLLM started (EngineCore, workers),
    or the first process when VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine in it. The first
    process of a normal start (CLI, API server) never runs one, and is spared importing the
    worker modules."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return True
    return not fork_server.engine_in_children()


def install_engine_seams() -> None:
    """The worker and capture seams (SeamError names the first one the installed vLLM lacks).
    Imported here: only the processes that run a worker need them (the API server is spared)."""
    from vllm_foundry import capture_patches, worker_patches

    worker_patches.install()
    capture_patches.install()


def _install_after_fork() -> None:
    try:
        install_engine_seams()
    except Exception as exc:  # noqa: BLE001 - an at-fork hook cannot raise into the child
        logger.error("foundry: vllm-foundry's seams could not be installed in the forked engine process (%s); it "
                     "starts without Foundry", exc)


def activate(settings: Settings) -> None:
    """Makes Foundry active in this process (idempotent): environment, logging, and the worker
    and capture seams where a worker may run. A wrong LOAD setting is refused here, in the first
    process, rather than when the workers restore (InvalidArgumentError naming the variable)."""
    if settings.mode in (Mode.LOAD, Mode.AUTO):
        modes.instantiate_mode()
        piecewise.instantiation()
    REGISTRATION.activate(settings, child_environment, _install_seams_here)
    _restore_model_info(settings)


_model_info_restored = False


def _restore_model_info(settings: Settings) -> None:
    """Before vLLM inspects the model's class (compile_cache.restore_model_info); once per process."""
    global _model_info_restored
    if _model_info_restored or settings.mode not in (Mode.LOAD, Mode.AUTO) or settings.archive is None \
            or not host_caches.enabled():
        return
    _model_info_restored = True
    try:
        copied = compile_cache.restore_model_info(settings.archive)
    except (OSError, ImportError) as exc:
        logger.warning("foundry: vLLM's model info not taken from the archive (%s); vLLM inspects the model", exc)
        return
    if copied is not None and copied.files:
        logger.info("foundry: vLLM's model info from the archive: %s", copied.describe())


def _install_seams_here() -> None:
    if hosts_engine():
        install_engine_seams()
        return
    # The first process: its engine-core launch forks from the fork server, when one runs.
    fork_patches.install()
    if preload_active():
        # vLLM will fork its engine process (which inherits the preload), and in that copy of this
        # process it does not load plugins again: install the seams there, right after the fork.
        os.register_at_fork(after_in_child=_install_after_fork)


def _reset_for_tests() -> None:
    global _model_info_restored
    REGISTRATION.reset()
    _model_info_restored = False
