"""``--foundry-archive DIR`` and ``--foundry-mode auto|save|load|off`` on vLLM's command line.

vLLM loads general plugins in process 0 *before* it parses argv (``AsyncEngineArgs.add_cli_args``
calls ``load_general_plugins()`` first, "plugin may update the parser"). register() therefore
wraps the static ``EngineArgs.add_cli_args`` (adds the two flags) and the class method
``EngineArgs.from_cli_args`` (which copies dataclass fields only): after it, the flags are exported
as ``FOUNDRY_ARCHIVE`` / ``FOUNDRY_MODE`` so every process vLLM starts later resolves the same
settings, and Foundry is activated in this process (activation.py: environment for the children,
worker seams). Flags win over the environment; the offline ``LLM(...)`` API uses the environment
alone.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import Any

from foundry_core.engine import Settings, flags
from foundry_core.engine.flags import ARCHIVE_FLAG, MODE_FLAG, export, settings_from_args

from vllm_foundry import activation, patching, ranks

logger = logging.getLogger("foundry.vllm")

__all__ = ["ARCHIVE_FLAG", "MODE_FLAG", "add_foundry_args", "settings_from_args", "export", "apply_cli_args",
           "wrap_add_cli_args", "wrap_from_cli_args", "export_replicas", "install"]


def add_foundry_args(parser: Any) -> Any:
    """Adds the Foundry flags to ``parser`` once (a second call on the same parser does nothing)."""
    return flags.add_foundry_args(parser, engine="vLLM", plugin="vllm-foundry")


def apply_cli_args(args: argparse.Namespace) -> Settings | None:
    """Exports the flags and activates Foundry when they ask for it; returns the settings."""
    return flags.apply_cli_args(args, activation.activate)


def wrap_add_cli_args(original: Callable[..., Any]) -> Callable[..., Any]:
    """``EngineArgs.add_cli_args`` that also adds the Foundry flags."""
    return flags.wrap_add_cli_args(original, lambda parser: add_foundry_args(parser))


def export_replicas(engine_args: Any) -> None:
    """Exports the data-parallel size (and its local part and backend, which the worker checks) as
    ``FOUNDRY_VLLM_DP_SIZE`` for the processes vLLM starts later: a dense model's replicas see data_parallel_size=1 in their own config (ranks.py), yet
    each must know the start's world to name its archive. Every `vllm serve` overwrites it."""
    size = int(getattr(engine_args, "data_parallel_size", None) or 1)
    local = getattr(engine_args, "data_parallel_size_local", None)
    os.environ[ranks.DP_SIZE_ENV] = str(size)
    os.environ[ranks.DP_SIZE_LOCAL_ENV] = str(int(local) if local is not None else size)
    os.environ[ranks.DP_BACKEND_ENV] = str(getattr(engine_args, "data_parallel_backend", None) or "mp")


def wrap_from_cli_args(original: Callable[..., Any]) -> Callable[..., Any]:
    """``EngineArgs.from_cli_args`` that then exports the flags and the data-parallel size and
    activates Foundry."""

    def apply(args: argparse.Namespace, engine_args: Any) -> None:
        export_replicas(engine_args)
        apply_cli_args(args)

    return flags.wrap_from_cli_args(original, apply)


def install(strict: bool) -> bool:
    """Wraps EngineArgs.add_cli_args / from_cli_args. When vLLM moved them: raises SeamError if
    ``strict`` (Foundry is active), else logs a warning (the flags are missing; the environment
    still works) and returns False."""
    return flags.install_cli_seams(patching.install, wrap_add_cli_args, wrap_from_cli_args, strict=strict, log=logger)
