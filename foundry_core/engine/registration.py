"""An engine plugin's registration in one process: the entry point the engine calls, and the
activation of Foundry when the settings ask for it.

Engines call a plugin's entry point in several of their processes, sometimes more than once, and
the settings may arrive later through the command line (:mod:`foundry_core.engine.flags`). A
:class:`PluginRegistration` keeps the two steps idempotent per process:

- :meth:`~PluginRegistration.register` (the entry point): installs the plugin's command-line
  wrappers once, and activates when ``FOUNDRY_ARCHIVE`` / ``FOUNDRY_MODE`` already make Foundry
  active;
- :meth:`~PluginRegistration.activate`: exports the environment the engine's children need on
  every call (settings may change between calls), and once per process sets up logging
  (:func:`~foundry_core.engine.logs.setup_logging`) and installs the plugin's engine seams where
  they belong.

Both count on this process's critical path (:mod:`foundry_core.engine.critical_path`), once Foundry
is active here: ``plugin import`` (the plugin's import, measured by its entry-point module, the
CLI wrappers and the settings) and ``seams`` (the first activation: logging, the child environment,
the seams, which may import the engine modules they wrap), with what the start-up hook spent
(``restart``, ``early start``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from foundry_core.engine import critical_path
from foundry_core.engine.logs import setup_logging
from foundry_core.engine.mode import Mode, Settings, resolve_settings
from foundry_core.errors import FoundryError

__all__ = ["PluginRegistration"]


class PluginRegistration:
    """The registration state of one plugin (``plugin``: its name in messages, ``log``: its
    logger) in this process. The plugin keeps one instance per process at module level.
    ``ledger``: where the registration's seconds are counted (default this process's)."""

    def __init__(self, plugin: str, log: logging.Logger, ledger: critical_path.Ledger | None = None) -> None:
        self.plugin = plugin
        self.log = log
        self.ledger = critical_path.LEDGER if ledger is None else ledger
        self.registered = False
        self.activated = False
        self._uncounted_s = 0.0  # registration seconds not in the ledger yet: Foundry may stay off

    def register(self, install_cli: Callable[[], Any], activate: Callable[[Settings], None],
                 on_error: Callable[[FoundryError], None] | None = None, imported_s: float = 0.0) -> None:
        """The plugin's entry point; safe to call any number of times: the first call runs
        ``install_cli()`` and, when the environment makes Foundry active, ``activate(settings)``;
        later calls do nothing. A FoundryError from resolving the settings or from ``activate`` is
        handed to ``on_error`` first when given (which may raise something else), then re-raised.
        ``imported_s``: how long the plugin took to import (counted once Foundry is active)."""
        if self.registered:
            return
        self.registered = True
        start = time.perf_counter()
        install_cli()
        try:
            settings = resolve_settings()
            self._uncounted_s += imported_s + time.perf_counter() - start
            if settings.mode is not Mode.OFF:
                activate(settings)
        except FoundryError as exc:
            if on_error is not None:
                on_error(exc)
            raise

    def activate(self, settings: Settings, child_environment: Callable[[Settings], Mapping[str, str]],
                 install_seams: Callable[[], Any]) -> None:
        """Makes Foundry active in this process for ``settings`` (nothing when they are OFF): puts
        ``child_environment(settings)`` in os.environ on every call; the first time also sets up
        logging and runs ``install_seams()`` (the plugin decides there whether this process runs a
        model)."""
        if settings.mode is Mode.OFF:
            return
        if self.activated:
            os.environ.update(child_environment(settings))
            return
        critical_path.take_startup(self.ledger)
        self.ledger.add("plugin import", self._uncounted_s)
        self._uncounted_s = 0.0
        with self.ledger.timed("seams"):
            setup_logging()  # first: what child_environment decides is logged
            os.environ.update(child_environment(settings))
            self.activated = True
            install_seams()
        self.log.debug("foundry: %s active (mode %s, archive %s)", self.plugin, settings.mode, settings.archive)

    def reset(self) -> None:
        """Forgets the registration and the activation (tests)."""
        self.registered = False
        self.activated = False
        self._uncounted_s = 0.0
