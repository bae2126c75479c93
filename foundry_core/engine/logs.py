"""Logging for the ``foundry`` logger in an engine's processes.

Engines configure their own loggers (vLLM) or only the root logger (SGLang), so the lines of an
engine plugin (loggers ``foundry.<engine>``) and of foundry_core would otherwise be lost or
formatted by chance. :func:`setup_logging` gives the ``foundry`` logger its own stderr handler.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

__all__ = ["LOG_ENV", "LOGGER", "FORMAT", "setup_logging"]

LOG_ENV = "FOUNDRY_LOG"  # the level: debug, info (default), warning, error
LOGGER = "foundry"
FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"
DATE_FORMAT = "%m-%d %H:%M:%S"


def setup_logging(environ: Mapping[str, str] | None = None) -> None:
    """Gives the ``foundry`` logger a stderr handler (``INFO 05-09 07:35:25 [foundry.vllm] ...``)
    at the level named by ``FOUNDRY_LOG`` (default info), not propagated to the root logger. Does
    nothing when the logger already has a handler (a second call, or the application set one up)."""
    root = logging.getLogger(LOGGER)
    if root.handlers:
        return
    env = os.environ if environ is None else environ
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    root.addHandler(handler)
    root.setLevel(env.get(LOG_ENV, "info").strip().upper() or "INFO")
    root.propagate = False
