"""The common part of an engine plugin's adapter (the object that answers the Foundry hooks).

A plugin's adapter subclasses :class:`EngineAdapter` and implements the required hooks
(:mod:`foundry_core.engine.hookspecs`) from the engine's configuration; the base keeps what the
plugin's seams record during start-up (``state``, written to the archive's engine state by
``foundry_record_state``) and the fallbacks of the session (``fallback_reasons``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from foundry_core.engine.mode import Mode

__all__ = ["EngineAdapter", "distribution_version"]

STATE_KEYS = ("kv_cache_bytes", "kv_cache_blocks")  # what foundry_record_state requires


def distribution_version(name: str) -> str:
    """The installed version of the distribution ``name`` (``"vllm"``); when its metadata cannot
    be read, the ``__version__`` of the package of that name (ImportError when there is none)."""
    try:
        from importlib import metadata

        return metadata.version(name)
    except Exception:  # noqa: BLE001
        import importlib

        return str(importlib.import_module(name).__version__)


class EngineAdapter:
    """Base of an engine adapter for one rank.

    - ``engine_version``: the engine's version for ``foundry_engine_identity`` (None: ask the
      installed distribution, :meth:`installed_engine_version`);
    - ``environ``: where the adapter reads environment variables (default os.environ);
    - ``state``: filled by the plugin's seams (it must hold ``kv_cache_bytes`` and
      ``kv_cache_blocks`` before :meth:`foundry_record_state` reports anything);
    - ``fallback_reasons``: every reason :meth:`foundry_on_fallback` was given, in order.

    Subclasses set ``logger`` (the plugin's) and ``distribution`` (the engine's distribution).
    """

    logger: ClassVar[logging.Logger] = logging.getLogger("foundry")
    distribution: ClassVar[str] = ""

    def __init__(self, *, engine_version: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        self._version = engine_version
        self._environ = os.environ if environ is None else environ
        self.state: dict[str, Any] = {}
        self.fallback_reasons: list[str] = []

    def installed_engine_version(self) -> str:
        """``engine_version`` when given, else the installed ``distribution``'s version."""
        return self._version or distribution_version(self.distribution)

    def foundry_record_state(self) -> dict[str, Any] | None:
        """A copy of ``state`` for the archive's engine state, or None until the seams recorded the
        KV cache (``kv_cache_bytes`` and ``kv_cache_blocks``)."""
        if any(key not in self.state for key in STATE_KEYS):
            return None
        return dict(self.state)

    def foundry_on_fallback(self, reason: str, mode: Mode) -> None:
        """Keeps ``reason`` in ``fallback_reasons`` (the session already logged the cause; the
        seams read the new mode from the session)."""
        self.fallback_reasons.append(reason)
        self.logger.debug("foundry: fallback to mode %s (%s)", mode, reason)
