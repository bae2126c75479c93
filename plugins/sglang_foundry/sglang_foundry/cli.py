"""``--foundry-archive DIR`` and ``--foundry-mode auto|save|load|off`` on SGLang's command line.

SGLang loads its plugins in the main process *before* it parses argv (``launch_server``,
``sglang serve``: ``load_plugins()`` then ``prepare_server_args(argv)``), and parses through
``ServerArgs.add_cli_args(parser)`` -> ``parser.parse_args`` -> ``ServerArgs.from_cli_args(args)``,
which copies the ServerArgs fields only (extra namespace keys are ignored; ``--config`` YAML goes
through the same parser). register() therefore wraps the static ``add_cli_args`` (adds the two
flags) and the class method ``from_cli_args``: after it, the flags are exported as
``FOUNDRY_ARCHIVE`` / ``FOUNDRY_MODE`` so every process SGLang spawns later resolves the same
settings, Foundry is activated in this process (activation.py: environment for the children), and
an unsupported configuration is refused here, before any scheduler starts. Flags win over the
environment; the offline ``sglang.Engine(...)`` API cannot take unknown keywords, so it uses the
environment alone.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from foundry_core.engine import Settings, flags
from foundry_core.engine.flags import ARCHIVE_FLAG, MODE_FLAG, export, settings_from_args

from sglang_foundry import activation, modes, patching

logger = logging.getLogger("foundry.sglang")

__all__ = ["ARCHIVE_FLAG", "MODE_FLAG", "add_foundry_args", "settings_from_args", "export", "apply_cli_args",
           "wrap_add_cli_args", "wrap_from_cli_args", "install"]


def add_foundry_args(parser: Any) -> Any:
    """Adds the Foundry flags to ``parser`` once (a second call on the same parser does nothing)."""
    return flags.add_foundry_args(parser, engine="SGLang", plugin="sglang-foundry", graphs="decode CUDA graphs")


def apply_cli_args(args: argparse.Namespace, server_args: Any = None) -> Settings | None:
    """Exports the flags, refuses an unsupported configuration and activates Foundry when the
    flags ask for it; returns the settings (None without flags)."""
    check = None if server_args is None else (lambda: modes.check_supported(server_args))
    return flags.apply_cli_args(args, activation.activate, check)


def wrap_add_cli_args(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ServerArgs.add_cli_args`` that also adds the Foundry flags."""
    return flags.wrap_add_cli_args(original, lambda parser: add_foundry_args(parser))


def wrap_from_cli_args(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ServerArgs.from_cli_args`` that then exports the flags, refuses an unsupported
    configuration and activates Foundry."""
    return flags.wrap_from_cli_args(original, lambda args, server_args: apply_cli_args(args, server_args))


def install(strict: bool) -> bool:
    """Wraps ServerArgs.add_cli_args / from_cli_args. When SGLang moved them: raises SeamError if
    ``strict``, else logs a warning (the flags are missing; the environment still works) and
    returns False."""
    return flags.install_cli_seams(patching.install, wrap_add_cli_args, wrap_from_cli_args, strict=strict, log=logger)
