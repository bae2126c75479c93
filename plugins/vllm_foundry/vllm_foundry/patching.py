"""Wrapping vLLM attributes named by ``seams.py``: idempotent, checked, reversible.

``install(seam, make_wrapper)`` resolves the seam's owner (module or class), checks the attribute
exists with the kind and leading parameters the seam declares, and replaces it with
``make_wrapper(original)`` (static and class methods keep their descriptor). A missing or changed
seam raises SeamError naming the seam, the attribute and the vLLM version. Installing twice is a
no-op; ``uninstall_all()`` puts the originals back (tests).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

from foundry_core.errors import UnsupportedError

from vllm_foundry.seams import TESTED_VERSIONS, Seam, seam

logger = logging.getLogger("foundry.vllm")

MARKER = "__foundry_seam__"
_installed: dict[str, tuple[Any, str, Any]] = {}  # seam name -> (owner, attribute, original raw attribute)


class SeamError(UnsupportedError):
    """A vLLM seam the plugin needs is missing or changed in the installed vLLM."""


def vllm_version() -> str:
    """The installed vLLM's version (``"unknown"`` when it cannot be read)."""
    try:
        from importlib import metadata

        return metadata.version("vllm")
    except Exception:  # noqa: BLE001 - a version string for messages only
        return "unknown"


def _fail(s: Seam, problem: str) -> SeamError:
    return SeamError(
        f"vllm-foundry: vLLM seam {s.name!r} ({s.target}) {problem} in vLLM {vllm_version()}; this vllm-foundry "
        f"was checked against vLLM {', '.join(TESTED_VERSIONS)} (purpose of the seam: {s.purpose}). Start vLLM "
        "with --foundry-mode off (or FOUNDRY_MODE=off) to run without Foundry")


def resolve(s: Seam) -> tuple[Any, str, Any]:
    """(owner, attribute name, raw attribute) of a seam in the installed vLLM; SeamError otherwise."""
    try:
        owner: Any = importlib.import_module(s.module)
    except ImportError as exc:
        raise _fail(s, f"cannot be imported ({exc})") from None
    parts = s.qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            raise _fail(s, f"does not exist ({part} is missing)")
    name = parts[-1]
    try:
        raw = inspect.getattr_static(owner, name)
    except AttributeError:
        raise _fail(s, "does not exist") from None
    return owner, name, raw


def _function_of(raw: Any) -> Callable[..., Any]:
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


def check_shape(s: Seam, raw: Any) -> None:
    """Raises SeamError when ``raw`` is not the kind of callable ``s`` expects, or its leading
    parameters differ."""
    expected = {"staticmethod": staticmethod, "classmethod": classmethod}.get(s.kind)
    if expected is not None and not isinstance(raw, expected):
        raise _fail(s, f"is a {type(raw).__name__}, expected a {s.kind}")
    func = _function_of(raw)
    if not callable(func):
        raise _fail(s, f"is a {type(raw).__name__}, not callable")
    try:
        params = list(inspect.signature(func).parameters)
    except (TypeError, ValueError) as exc:
        raise _fail(s, f"has no readable signature ({exc})") from None
    if tuple(params[:len(s.params)]) != s.params:
        raise _fail(s, f"takes ({', '.join(params)}), expected parameters starting with ({', '.join(s.params)})")


def is_installed(name: str) -> bool:
    return name in _installed


def install(name: str, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Wraps seam ``name`` with ``make_wrapper(original_function)``; returns False when it was
    already wrapped (by this process, or by a copy of this module loaded twice)."""
    s = seam(name)
    if name in _installed:
        return False
    owner, attr, raw = resolve(s)
    func = _function_of(raw)
    if getattr(func, MARKER, None) == name:
        return False
    check_shape(s, raw)
    wrapper = make_wrapper(func)
    functools.update_wrapper(wrapper, func)
    setattr(wrapper, MARKER, name)
    if isinstance(raw, staticmethod):
        new: Any = staticmethod(wrapper)
    elif isinstance(raw, classmethod):
        new = classmethod(wrapper)
    else:
        new = wrapper
    setattr(owner, attr, new)
    _installed[name] = (owner, attr, raw)
    logger.debug("foundry: wrapped %s", s.target)
    return True


def original(name: str) -> Callable[..., Any]:
    """The function a seam wrapped (KeyError when it is not installed)."""
    return _function_of(_installed[name][2])


def uninstall_all() -> None:
    """Puts every wrapped attribute back (tests)."""
    for name in list(_installed):
        owner, attr, raw = _installed.pop(name)
        setattr(owner, attr, raw)
