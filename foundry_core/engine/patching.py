"""Wrapping engine attributes named by a :class:`~foundry_core.engine.seam.SeamTable`: idempotent,
checked, reversible.

``Patcher(table).install(name, make_wrapper)`` resolves the seam's owner (module or class), checks
the attribute exists with the kind and leading parameters the seam declares, and replaces it with
``make_wrapper(original)`` (static and class methods keep their descriptor). A missing or changed
seam raises :class:`SeamError` naming the seam, the attribute, the installed engine version and
the tested ones. Installing twice is a no-op; ``uninstall_all()`` puts the originals back (tests).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

from foundry_core.engine import critical_path
from foundry_core.engine.seam import Seam, SeamTable
from foundry_core.errors import UnsupportedError

# Set on every wrapper: a second copy of a plugin module (or a second Patcher) sees the seam is
# already wrapped and does not wrap the wrapper.
MARKER = "__foundry_seam__"

Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


class SeamError(UnsupportedError):
    """A seam the plugin needs is missing or changed in the installed engine."""


def _function_of(raw: Any) -> Callable[..., Any]:
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


class Patcher:
    """Installs and removes the wrappers of one plugin's seams.

    ``plugin`` names the plugin in messages ("vllm-foundry"); ``off_hint`` ends every SeamError
    (how to run the engine without Foundry); ``version`` returns the installed engine's version
    for messages (default: ``table.version``).
    """

    def __init__(self, table: SeamTable, *, plugin: str = "foundry", off_hint: str = "",
                 version: Callable[[], str] | None = None) -> None:
        self.table = table
        self.plugin = plugin
        self.off_hint = off_hint
        self._version = version or table.version
        self._installed: dict[str, tuple[Any, str, Any]] = {}  # seam name -> (owner, attribute, raw original)
        self._logger = logging.getLogger(f"foundry.{table.package}")

    def error(self, s: Seam, problem: str) -> SeamError:
        """A SeamError saying ``s`` ``problem`` in the installed engine (``problem``: "does not exist")."""
        engine = self.table.engine
        text = (f"{self.plugin}: {engine} seam {s.name!r} ({s.target}) {problem} in {engine} {self._version()}; "
                f"this {self.plugin} was checked against {engine} {', '.join(self.table.tested_versions)} "
                f"(purpose of the seam: {s.purpose}).")
        return SeamError(f"{text} {self.off_hint}" if self.off_hint else text)

    def resolve(self, s: Seam) -> tuple[Any, str, Any]:
        """(owner, attribute name, raw attribute) of a seam in the installed engine; SeamError otherwise."""
        try:
            # The engine imports the module anyway (it calls the seam): not Foundry's time.
            with critical_path.LEDGER.engine_work("engine imports"):
                owner: Any = importlib.import_module(s.module)
        except ImportError as exc:
            raise self.error(s, f"cannot be imported ({exc})") from None
        parts = s.qualname.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
            if owner is None:
                raise self.error(s, f"does not exist ({part} is missing)")
        name = parts[-1]
        try:
            raw = inspect.getattr_static(owner, name)
        except AttributeError:
            raise self.error(s, "does not exist") from None
        return owner, name, raw

    def check_shape(self, s: Seam, raw: Any) -> None:
        """Raises SeamError when ``raw`` is not the kind of callable ``s`` expects, or its leading
        parameters differ."""
        expected = {"staticmethod": staticmethod, "classmethod": classmethod}.get(s.kind)
        if expected is not None and not isinstance(raw, expected):
            raise self.error(s, f"is a {type(raw).__name__}, expected a {s.kind}")
        func = _function_of(raw)
        if not callable(func):
            raise self.error(s, f"is a {type(raw).__name__}, not callable")
        try:
            params = list(inspect.signature(func).parameters)
        except (TypeError, ValueError) as exc:
            raise self.error(s, f"has no readable signature ({exc})") from None
        if tuple(params[:len(s.params)]) != s.params:
            raise self.error(s, f"takes ({', '.join(params)}), expected parameters starting with "
                                f"({', '.join(s.params)})")

    def is_installed(self, name: str) -> bool:
        """Whether this patcher wrapped seam ``name``."""
        return name in self._installed

    def install(self, name: str, make_wrapper: Wrapper) -> bool:
        """Wraps seam ``name`` with ``make_wrapper(original_function)``; returns False when it was
        already wrapped (by this patcher, or by another one sharing the marker, e.g. a copy of the
        plugin's module loaded twice). SeamError when the seam is missing or changed."""
        s = self.table.seam(name)
        if name in self._installed:
            return False
        owner, attr, raw = self.resolve(s)
        func = _function_of(raw)
        if getattr(func, MARKER, None) == name:
            return False
        self.check_shape(s, raw)
        wrapper = make_wrapper(func)
        functools.update_wrapper(wrapper, func)
        setattr(wrapper, MARKER, name)
        new: Any = wrapper
        if isinstance(raw, (staticmethod, classmethod)):
            new = type(raw)(wrapper)  # keep the descriptor, or the class would bind it differently
        setattr(owner, attr, new)
        self._installed[name] = (owner, attr, raw)
        self._logger.debug("foundry: wrapped %s", s.target)
        return True

    def installed_names(self) -> list[str]:
        """The seams this patcher wrapped, in the order it wrapped them."""
        return list(self._installed)

    def original(self, name: str) -> Callable[..., Any]:
        """The function a seam wrapped (KeyError when it is not installed)."""
        return _function_of(self._installed[name][2])

    def uninstall_all(self) -> None:
        """Puts every wrapped attribute back (tests)."""
        for name in list(self._installed):
            owner, attr, raw = self._installed.pop(name)
            setattr(owner, attr, raw)
