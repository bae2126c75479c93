"""Wrapping vLLM attributes named by ``seams.py``: idempotent, checked, reversible.

``install(seam, make_wrapper)`` resolves the seam's owner (module or class), checks the attribute
exists with the kind and leading parameters the seam declares, and replaces it with
``make_wrapper(original)`` (static and class methods keep their descriptor). A missing or changed
seam raises SeamError naming the seam, the attribute and the vLLM version. Installing twice is a
no-op; ``uninstall_all()`` puts the originals back (tests).

The functions delegate to one :class:`foundry_core.engine.patching.Patcher` over ``seams.TABLE``,
which holds the registry of installed wrappers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from foundry_core.engine.patching import MARKER, Patcher, SeamError
from foundry_core.engine.seam import Seam

from vllm_foundry.seams import TABLE

__all__ = ["MARKER", "SeamError", "vllm_version", "resolve", "check_shape", "install", "is_installed", "original",
           "uninstall_all"]

OFF_HINT = "Start vLLM with --foundry-mode off (or FOUNDRY_MODE=off) to run without Foundry"


def vllm_version() -> str:
    """The installed vLLM's version (``"unknown"`` when it cannot be read)."""
    return TABLE.version()


# The lambda looks vllm_version up at each message, so tests can replace it on this module.
_PATCHER = Patcher(TABLE, plugin="vllm-foundry", off_hint=OFF_HINT, version=lambda: vllm_version())


def resolve(s: Seam) -> tuple[Any, str, Any]:
    """(owner, attribute name, raw attribute) of a seam in the installed vLLM; SeamError otherwise."""
    return _PATCHER.resolve(s)


def check_shape(s: Seam, raw: Any) -> None:
    """Raises SeamError when ``raw`` is not the kind of callable ``s`` expects, or its leading
    parameters differ."""
    _PATCHER.check_shape(s, raw)


def is_installed(name: str) -> bool:
    """Whether seam ``name`` is wrapped by this process."""
    return _PATCHER.is_installed(name)


def install(name: str, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Wraps seam ``name`` with ``make_wrapper(original_function)``; returns False when it was
    already wrapped (by this process, or by a copy of this module loaded twice)."""
    return _PATCHER.install(name, make_wrapper)


def original(name: str) -> Callable[..., Any]:
    """The function a seam wrapped (KeyError when it is not installed)."""
    return _PATCHER.original(name)


def uninstall_all() -> None:
    """Puts every wrapped attribute back (tests)."""
    _PATCHER.uninstall_all()
