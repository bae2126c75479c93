"""``--foundry-archive DIR`` and ``--foundry-mode auto|save|load|off`` on an engine's command line.

An engine plugin wraps the engine's own argument-parser builder (``add_cli_args``) and the
function that turns the parsed namespace into the engine's settings (``from_cli_args``), both
named by its seam table:

- :func:`add_foundry_args` adds the two flags (once) to the parser the builder returns;
- :func:`apply_cli_args` reads them (:func:`settings_from_args`: flags win over the environment),
  exports them as ``FOUNDRY_ARCHIVE`` / ``FOUNDRY_MODE`` (:func:`export`) so every process the
  engine starts later resolves the same settings, and activates Foundry in this process;
- :func:`install_cli_seams` wraps the two seams, and degrades to a warning (the environment
  variables still work) when the engine moved them and Foundry is not active.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import Any

from foundry_core.engine.mode import ARCHIVE_ENV, CHOICES, MODE_ENV, Mode, Settings, resolve_settings
from foundry_core.engine.patching import SeamError, Wrapper

__all__ = ["ARCHIVE_FLAG", "MODE_FLAG", "add_foundry_args", "settings_from_args", "export", "apply_cli_args",
           "wrap_add_cli_args", "wrap_from_cli_args", "install_cli_seams"]

ARCHIVE_FLAG = "--foundry-archive"
MODE_FLAG = "--foundry-mode"


def add_foundry_args(parser: Any, *, engine: str, plugin: str, graphs: str = "CUDA graphs") -> Any:
    """Adds the Foundry flags to ``parser`` (an ``argparse.ArgumentParser`` or an engine's
    subclass of it) in a "Foundry" group whose description says which ``graphs`` the ``engine``
    captures and names the ``plugin`` ("Persist the CUDA graphs vLLM captures ... (vllm-foundry)").
    Once: a second call on the same parser does nothing. Returns ``parser``."""
    for action in getattr(parser, "_actions", []):
        if ARCHIVE_FLAG in getattr(action, "option_strings", ()):
            return parser
    group = parser.add_argument_group(
        "Foundry", f"Persist the {graphs} {engine} captures and restore them at the next start ({plugin}).")
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
    """Writes the settings to this process's environment (``FOUNDRY_MODE``, and
    ``FOUNDRY_ARCHIVE`` as an absolute path when there is an archive), which every later child
    inherits."""
    os.environ[MODE_ENV] = settings.mode.value
    if settings.archive is not None:
        os.environ[ARCHIVE_ENV] = os.path.abspath(os.fspath(settings.archive))


def apply_cli_args(args: argparse.Namespace, activate: Callable[[Settings], None],
                   check: Callable[[], None] | None = None) -> Settings | None:
    """Exports the flags of ``args`` and, when they make Foundry active, calls ``check()`` (the
    plugin refuses an unsupported configuration by raising) and then ``activate`` with the
    settings resolved from the exported environment. Returns the flags' settings, or None when
    neither flag was given (nothing is exported then)."""
    settings = settings_from_args(args)
    if settings is None:
        return None
    export(settings)
    if settings.mode is not Mode.OFF:
        if check is not None:
            check()
        activate(resolve_settings())
    return settings


def wrap_add_cli_args(original: Callable[..., Any], add: Callable[[Any], Any]) -> Callable[..., Any]:
    """The wrapper of an engine's ``add_cli_args(parser, ...)``: calls it, then ``add`` (the
    plugin's :func:`add_foundry_args`) on the parser it returned (or the one it was given, when
    it returns None)."""

    def add_cli_args(parser: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(parser, *args, **kwargs)
        add(result if result is not None else parser)
        return result

    return add_cli_args


def wrap_from_cli_args(original: Callable[..., Any],
                       apply: Callable[[argparse.Namespace, Any], Any]) -> Callable[..., Any]:
    """The wrapper of an engine's class method ``from_cli_args(cls, args, ...)``: calls it, then
    ``apply(args, engine_settings)`` with what it returned, which the wrapper returns."""

    def from_cli_args(cls: Any, args: argparse.Namespace, *rest: Any, **kwargs: Any) -> Any:
        engine_args = original(cls, args, *rest, **kwargs)
        apply(args, engine_args)
        return engine_args

    return from_cli_args


def install_cli_seams(install: Callable[[str, Wrapper], bool], wrap_add: Wrapper, wrap_from: Wrapper, *,
                      strict: bool, log: logging.Logger, add_seam: str = "cli.add_cli_args",
                      from_seam: str = "cli.from_cli_args") -> bool:
    """Wraps the seams ``add_seam`` and ``from_seam`` with ``install(name, make_wrapper)`` (a
    plugin's ``patching.install``). When the engine moved them: raises the SeamError if
    ``strict`` (Foundry is active), else logs a warning on ``log`` (the flags are unavailable, the
    environment variables still work) and returns False. True when both are wrapped."""
    try:
        install(add_seam, wrap_add)
        install(from_seam, wrap_from)
    except SeamError as exc:
        if strict:
            raise
        log.warning("%s. %s and %s are unavailable; set %s / %s instead", exc, ARCHIVE_FLAG, MODE_FLAG,
                    ARCHIVE_ENV, MODE_ENV)
        return False
    return True
