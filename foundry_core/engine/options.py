"""Readers for an engine plugin's own environment variables (``FOUNDRY_<ENGINE>_*``).

Each plugin names its variables (so ``FOUNDRY_VLLM_INSTANTIATE`` and
``FOUNDRY_SGLANG_INSTANTIATE`` stay apart) and reads them with these functions, which give the
same defaults and the same error messages in every plugin.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from foundry_core.errors import InvalidArgumentError

__all__ = ["FALSE_VALUES", "env_choice", "env_flag", "instantiate_mode"]

FALSE_VALUES = ("0", "false", "no", "off")
DEFAULT_INSTANTIATE = "eager"
DEFAULT_INSTANTIATE_THREADS = 4


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def env_flag(name: str, default: bool = True, environ: Mapping[str, str] | None = None) -> bool:
    """A boolean variable of ``environ`` (default os.environ): unset or empty gives ``default``;
    0/false/no/off (any case) give False, anything else True."""
    value = _env(environ).get(name, "").strip().lower()
    if not value:
        return default
    return value not in FALSE_VALUES


def env_choice(name: str, choices: tuple[str, ...], default: str, environ: Mapping[str, str] | None = None) -> str:
    """A variable of ``environ`` (default os.environ) that names one of ``choices`` (any case):
    unset or empty gives ``default``; anything else is an InvalidArgumentError naming the variable
    and the choices."""
    value = _env(environ).get(name, "").strip().lower() or default
    if value not in choices:
        raise InvalidArgumentError(f"{name}={value!r}: choose one of {', '.join(choices)}")
    return value


def instantiate_mode(mode_env: str, threads_env: str, environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """How LOAD instantiates the restored graphs: (mode, threads) from the variables ``mode_env``
    (one of :data:`foundry_core.graphs.MODES`, default ``eager``) and ``threads_env`` (an integer,
    default 4, at least 1). InvalidArgumentError naming the variable for any other value."""
    from foundry_core.graphs import MODES

    env = _env(environ)
    mode = env_choice(mode_env, MODES, DEFAULT_INSTANTIATE, env)
    try:
        threads = int(env.get(threads_env, str(DEFAULT_INSTANTIATE_THREADS)))
    except ValueError:
        raise InvalidArgumentError(f"{threads_env} must be an integer") from None
    return mode, max(threads, 1)
