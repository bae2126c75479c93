"""Wrapping SGLang attributes named by ``seams.py``: idempotent, checked, reversible.

The functions delegate to one :class:`foundry_core.engine.patching.Patcher` over ``seams.TABLE``
(the registry of installed wrappers); a missing or changed seam raises SeamError naming the seam,
the attribute, the installed SGLang version and the tested one, and the way out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from foundry_core.engine.patching import MARKER, Patcher, SeamError

from sglang_foundry.seams import TABLE

__all__ = ["MARKER", "SeamError", "OFF_HINT", "sglang_version", "install", "is_installed", "original", "resolve",
           "uninstall_all"]

OFF_HINT = "Start SGLang with --foundry-mode off (or FOUNDRY_MODE=off) to run it without Foundry"


def sglang_version() -> str:
    """The installed SGLang's version (``"unknown"`` when it cannot be read)."""
    return TABLE.version()


# The lambda looks sglang_version up at each message, so tests can replace it on this module.
_PATCHER = Patcher(TABLE, plugin="sglang-foundry", off_hint=OFF_HINT, version=lambda: sglang_version())


def install(name: str, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Wraps seam ``name`` with ``make_wrapper(original_function)``; False when it was already
    wrapped (by this process, or by a copy of this module loaded twice)."""
    return _PATCHER.install(name, make_wrapper)


def resolve(name: str) -> Any:
    """The attribute seam ``name`` names in the installed SGLang (to call or read it, never to
    wrap); SeamError when it is missing."""
    return _PATCHER.resolve(TABLE.seam(name))[2]


def is_installed(name: str) -> bool:
    """Whether seam ``name`` is wrapped in this process."""
    return _PATCHER.is_installed(name)


def original(name: str) -> Callable[..., Any]:
    """The function a seam wrapped (KeyError when it is not installed)."""
    return _PATCHER.original(name)


def uninstall_all() -> None:
    """Puts every wrapped attribute back (tests)."""
    _PATCHER.uninstall_all()
