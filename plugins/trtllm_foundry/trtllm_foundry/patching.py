"""Wrapping TensorRT-LLM attributes named by ``seams.py``: idempotent, checked, reversible.

The functions delegate to one :class:`foundry_core.engine.patching.Patcher` over ``seams.TABLE``;
a missing or changed seam raises SeamError naming the seam, the attribute, the installed
TensorRT-LLM version and the tested one, and the way out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from foundry_core.engine.patching import MARKER, Patcher, SeamError

from trtllm_foundry.modes import OFF_HINT
from trtllm_foundry.seams import TABLE

__all__ = ["MARKER", "SeamError", "trtllm_version", "install", "is_installed", "original", "installed_names",
           "uninstall_all", "error", "resolve"]


def trtllm_version() -> str:
    """The installed TensorRT-LLM's version (``"unknown"`` when it cannot be read)."""
    return TABLE.version()


_PATCHER = Patcher(TABLE, plugin="trtllm-foundry", off_hint=OFF_HINT[0].upper() + OFF_HINT[1:],
                   version=lambda: trtllm_version())


def install(name: str, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Wraps seam ``name`` with ``make_wrapper(original_function)``; False when it was already wrapped."""
    return _PATCHER.install(name, make_wrapper)


def is_installed(name: str) -> bool:
    """Whether seam ``name`` is wrapped in this process."""
    return _PATCHER.is_installed(name)


def installed_names() -> list[str]:
    """The seams wrapped in this process, in the order they were wrapped."""
    return _PATCHER.installed_names()


def original(name: str) -> Callable[..., Any]:
    """The function a seam wrapped (KeyError when it is not installed)."""
    return _PATCHER.original(name)


def resolve(name: str) -> tuple[Any, str, Any]:
    """(owner, attribute name, raw attribute) of seam ``name`` in the installed TensorRT-LLM;
    SeamError when its module cannot be imported or the attribute does not exist."""
    return _PATCHER.resolve(TABLE.seam(name))


def error(name: str, problem: str) -> SeamError:
    """A SeamError saying seam ``name`` ``problem`` in the installed TensorRT-LLM."""
    return _PATCHER.error(TABLE.seam(name), problem)


def uninstall_all() -> None:
    """Puts every wrapped attribute back (tests)."""
    _PATCHER.uninstall_all()
