"""The environment every GPU process of an engine needs, set before the engine starts children.

libfoundry.so interposes driver calls from process start, so it must be in ``LD_PRELOAD`` when
each worker process execs; it cannot be switched on later. Some NCCL / NVSHMEM / torch paths map
memory with flags the deterministic region lacks (NVLink SHARP multicast, cuMem-backed NCCL
buffers), so they are turned off.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from foundry_core.autopreload import RESTART_AT_ENV
from foundry_core.engine.mode import Mode, Settings, parse_mode
from foundry_core.errors import StateError
from foundry_core.preload import preload_environment

logger = logging.getLogger("foundry")

FOUNDRY_PREFIX = "FOUNDRY_"
REEXEC_MARKER = "FOUNDRY_REEXECED"
STRICT_ENV = "FOUNDRY_STRICT"
REQUIRED_SETTINGS: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "NCCL_CUMEM_ENABLE": "0",
    # Every NCCL connection made at communicator creation, outside the region, not lazily at the
    # first collective of a size (which may be inside a graph capture).
    "NCCL_RUNTIME_CONNECT": "0",
}


def prepare_child_environment(env: Mapping[str, str] | None = None, *, archive: str | os.PathLike | None = None,
                              mode: Mode | str | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: os.environ) for the engine's GPU processes.

    - libfoundry.so first in ``LD_PRELOAD`` (once);
    - ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``,
      ``NCCL_CUMEM_ENABLE=0``, ``NCCL_RUNTIME_CONNECT=0`` (a different value the user set is
      overridden, with a warning);
    - every ``FOUNDRY_*`` variable of this process that ``env`` lacks;
    - ``FOUNDRY_ARCHIVE`` / ``FOUNDRY_MODE`` from ``archive`` / ``mode`` when given, so children
      that never see the command line resolve the same settings.

    Idempotent: preparing a prepared environment changes nothing. In the engine's first process,
    ``os.environ.update(prepare_child_environment(...))`` before any worker is spawned.
    Raises FileNotFoundError when libfoundry.so cannot be found.
    """
    out = preload_environment(dict(os.environ if env is None else env))
    for key, value in os.environ.items():
        if key.startswith(FOUNDRY_PREFIX) and key != REEXEC_MARKER:
            out.setdefault(key, value)
    for key, value in REQUIRED_SETTINGS.items():
        if out.get(key, value) != value:
            logger.warning("foundry: overriding %s=%s with %s (the deterministic region cannot back it)", key,
                           out[key], value)
        out[key] = value
    if archive is not None:
        out["FOUNDRY_ARCHIVE"] = os.fspath(archive)
    if mode is not None:
        out["FOUNDRY_MODE"] = parse_mode(mode).value
    return out


def plugin_child_environment(settings: Settings, *, plugin: str, off_hint: str,
                             prepare: Callable[..., dict[str, str]] = prepare_child_environment) -> dict[str, str]:
    """What an engine plugin puts in ``os.environ`` before the engine starts its children:
    ``prepare(archive=..., mode=...)`` (default :func:`prepare_child_environment`) for
    ``settings``, plus ``FOUNDRY_STRICT=1`` unless it is set. StateError naming ``plugin`` and
    ending with ``off_hint`` (how to run without Foundry) when libfoundry.so cannot be found."""
    try:
        env = prepare(archive=settings.archive, mode=settings.mode)
    except FileNotFoundError as exc:
        raise StateError(f"{plugin}: libfoundry.so was not found ({exc}); reinstall foundry-core, or "
                         f"{off_hint}") from None
    env.setdefault(STRICT_ENV, "1")
    return env


def preload_active() -> bool:
    """Whether this process runs with libfoundry.so preloaded; False when the library cannot be
    loaded at all."""
    try:
        from foundry_core import _native

        return bool(_native.lib().foundry_preload_active())
    except (OSError, ImportError, AttributeError):
        return False


def ensure_preloaded_or_reexec(argv: Sequence[str] | None = None, *, reexec: bool = False) -> bool:
    """Reports whether this process has the preload (True) or not (False).

    With ``reexec=True`` and no preload, replaces this process with the same command line (or
    ``sys.executable *argv``) under
    :func:`prepare_child_environment` (for an engine that runs its GPU work in-process). A process
    that was already re-executed and still lacks the preload raises StateError instead of looping.
    """
    if preload_active():
        return True
    if not reexec:
        return False
    if os.environ.get(REEXEC_MARKER) == "1":
        raise StateError("re-executed with LD_PRELOAD but libfoundry.so is still not active; check that "
                         f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r} names a loadable libfoundry.so")
    env = prepare_child_environment()
    env[REEXEC_MARKER] = "1"
    env[RESTART_AT_ENV] = repr(time.time())  # the restarted interpreter's start-up hook reads it
    # sys.orig_argv keeps the interpreter's own options (-m module, -X ...).
    args = list(sys.orig_argv) if argv is None else [sys.executable, *argv]
    logger.info("foundry: restarting this process with libfoundry.so preloaded")
    os.execve(sys.executable, args, env)
    return False  # not reached
