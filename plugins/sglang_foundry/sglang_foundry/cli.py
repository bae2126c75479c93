"""``--foundry-archive DIR`` and ``--foundry-mode auto|save|load|off`` on SGLang's command line.

SGLang loads its plugins in the main process *before* it parses argv (``launch_server``,
``sglang serve``: ``load_plugins()`` then ``prepare_server_args(argv)``), and parses through
``ServerArgs.add_cli_args(parser)`` -> ``parser.parse_args`` -> ``ServerArgs.from_cli_args(args)``,
which copies the ServerArgs fields only (extra namespace keys are ignored; ``--config`` YAML goes
through the same parser). register() therefore wraps the static ``add_cli_args`` (adds the two
flags) and the class method ``from_cli_args``: after it, the flags are exported as
``FOUNDRY_ARCHIVE`` / ``FOUNDRY_MODE`` so every process SGLang spawns later resolves the same
settings, Foundry is activated in this process (environment for the children), and an unsupported
configuration is refused here, before any scheduler starts. Flags win over the environment; the
offline ``sglang.Engine(...)`` API cannot take unknown keywords, so it uses the environment alone.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import Any

from foundry_core.engine import Mode, Settings, resolve_settings
from foundry_core.engine.mode import ARCHIVE_ENV, CHOICES, MODE_ENV

from sglang_foundry import modes, patching

logger = logging.getLogger("foundry.sglang")

ARCHIVE_FLAG = "--foundry-archive"
MODE_FLAG = "--foundry-mode"


def add_foundry_args(parser: Any) -> Any:
    """Adds the Foundry flags to ``parser`` once (a second call on the same parser does nothing)."""
    for action in getattr(parser, "_actions", []):
        if ARCHIVE_FLAG in getattr(action, "option_strings", ()):
            return parser
    group = parser.add_argument_group(
        "Foundry", "Persist the decode CUDA graphs SGLang captures and restore them at the next start "
                   "(sglang-foundry).")
    group.add_argument(ARCHIVE_FLAG, dest="foundry_archive", metavar="DIR", default=None,
                       help=f"Archive directory (default: ${ARCHIVE_ENV}). Without an archive Foundry is off.")
    group.add_argument(MODE_FLAG, dest="foundry_mode", choices=CHOICES, default=None,
                       help=f"auto: load a complete archive, else capture and save one (default; ${MODE_ENV}); "
                            "save: always capture and write; load: restore, fall back to a normal start without "
                            "writing; off: do nothing.")
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings | None:
    """The settings the parsed flags ask for (flags > environment), or None when neither flag
    was given."""
    archive = getattr(args, "foundry_archive", None)
    mode = getattr(args, "foundry_mode", None)
    if archive is None and mode is None:
        return None
    return resolve_settings(mode, archive)


def export(settings: Settings) -> None:
    """Writes the settings to this process's environment, which every later child inherits."""
    os.environ[MODE_ENV] = settings.mode.value
    if settings.archive is not None:
        os.environ[ARCHIVE_ENV] = os.path.abspath(os.fspath(settings.archive))


def apply_cli_args(args: argparse.Namespace, server_args: Any = None) -> Settings | None:
    """Exports the flags, refuses an unsupported configuration and activates Foundry when the
    flags ask for it; returns the settings (None without flags)."""
    settings = settings_from_args(args)
    if settings is None:
        return None
    export(settings)
    if settings.mode is not Mode.OFF:
        if server_args is not None:
            modes.check_supported(server_args)
        from sglang_foundry.register import activate

        activate(resolve_settings())
    return settings


def wrap_add_cli_args(original: Callable[..., Any]) -> Callable[..., Any]:
    def add_cli_args(parser: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(parser, *args, **kwargs)
        add_foundry_args(result if result is not None else parser)
        return result

    return add_cli_args


def wrap_from_cli_args(original: Callable[..., Any]) -> Callable[..., Any]:
    def from_cli_args(cls: Any, args: argparse.Namespace, *rest: Any, **kwargs: Any) -> Any:
        server_args = original(cls, args, *rest, **kwargs)
        apply_cli_args(args, server_args)
        return server_args

    return from_cli_args


def install(strict: bool) -> bool:
    """Wraps ServerArgs.add_cli_args / from_cli_args. When SGLang moved them: raises SeamError if
    ``strict``, else logs a warning (the flags are missing; the environment still works) and
    returns False."""
    try:
        patching.install("cli.add_cli_args", wrap_add_cli_args)
        patching.install("cli.from_cli_args", wrap_from_cli_args)
    except patching.SeamError as exc:
        if strict:
            raise
        logger.warning("%s. %s and %s are unavailable; set %s / %s instead", exc, ARCHIVE_FLAG, MODE_FLAG,
                       ARCHIVE_ENV, MODE_ENV)
        return False
    return True
