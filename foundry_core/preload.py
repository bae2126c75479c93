"""The environment that starts a process with libfoundry.so preloaded."""

from __future__ import annotations

import os

from foundry_core import _library


def preload_path() -> str:
    """Absolute path of the libfoundry.so to put in LD_PRELOAD."""
    return str(_library.library_path())


def preload_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default: os.environ) with libfoundry.so first in LD_PRELOAD.

    Idempotent: the library is not added twice. Child processes inherit it, so every process the
    command starts (compilers, workers) carries the preload; ones that never use CUDA are unaffected.
    """
    env = dict(os.environ if base is None else base)
    lib = preload_path()
    current = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    if lib not in current:
        current.insert(0, lib)
    env["LD_PRELOAD"] = " ".join(current)
    return env
