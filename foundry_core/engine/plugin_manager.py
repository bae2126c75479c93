"""The pluggy plugin manager through which engine adapters answer Foundry's hooks."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import pluggy

from foundry_core.engine import hookspecs
from foundry_core.errors import InvalidArgumentError

ENTRY_POINT_GROUP = "foundry.engines"
_HOOK_PREFIX = hookspecs.PROJECT + "_"


def _known_hooks() -> list[str]:
    return sorted(n for n, f in vars(hookspecs).items()
                  if n.startswith(_HOOK_PREFIX) and inspect.isfunction(f))


class FoundryPluginManager(pluggy.PluginManager):
    """A PluginManager for project ``foundry`` with the engine hookspecs.

    Unlike plain pluggy, every callable ``foundry_*`` attribute of an adapter is a hook
    implementation, decorated or not, so a misspelt hook name is refused at registration instead
    of being silently ignored.
    """

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)

    def parse_hookimpl_opts(self, plugin: Any, name: str):  # type: ignore[override]
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(_HOOK_PREFIX):
            attr = inspect.getattr_static(plugin, name, None)
            if isinstance(attr, (staticmethod, classmethod)) or inspect.isroutine(attr):
                return {}
        return opts

    def register_adapter(self, adapter: Any, name: str | None = None) -> str:
        """Registers an engine adapter (module or object) after validating it; returns its name.

        Raises InvalidArgumentError naming the hook when the adapter implements a hook Foundry does
        not define (with the closest known name) or declares arguments the hook does not pass.
        """
        label = name or getattr(adapter, "__name__", None) or type(adapter).__name__
        known = _known_hooks()
        for attr in dir(adapter):
            if attr.startswith(_HOOK_PREFIX) and self.parse_hookimpl_opts(adapter, attr) is not None:
                spec_name = (self.parse_hookimpl_opts(adapter, attr) or {}).get("specname") or attr
                if spec_name not in known:
                    close = difflib.get_close_matches(spec_name, known, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise InvalidArgumentError(
                        f"engine adapter {label!r} implements {spec_name!r}, which is not a Foundry hook{hint}; "
                        f"the hooks are {', '.join(known)}")
        try:
            registered = self.register(adapter, name=name)
        except pluggy.PluginValidationError as exc:
            raise InvalidArgumentError(f"engine adapter {label!r} is invalid: {exc}") from None
        except ValueError as exc:
            raise InvalidArgumentError(f"engine adapter {label!r}: {exc}") from None
        if registered is None:
            raise InvalidArgumentError(f"engine adapter {label!r} is blocked and was not registered")
        return registered

    def missing_hooks(self) -> list[str]:
        """The required hooks (hookspecs.REQUIRED_HOOKS) no registered adapter implements."""
        return [h for h in hookspecs.REQUIRED_HOOKS if not getattr(self.hook, h).get_hookimpls()]

    def validate(self) -> None:
        """Raises InvalidArgumentError naming the required hooks no adapter implements, or an
        unknown hook some adapter implements."""
        try:
            self.check_pending()
        except pluggy.PluginValidationError as exc:
            raise InvalidArgumentError(f"engine adapter is invalid: {exc}") from None
        missing = self.missing_hooks()
        if missing:
            adapters = ", ".join(n for n, _ in self.list_name_plugin()) or "none registered"
            raise InvalidArgumentError(
                f"no engine adapter implements {', '.join(missing)} (adapters: {adapters}); an adapter must "
                f"implement {', '.join(hookspecs.REQUIRED_HOOKS)}")


def get_plugin_manager(*adapters: Any, entry_points: bool = False, require: bool = True) -> FoundryPluginManager:
    """A new plugin manager with ``adapters`` registered and validated.

    entry_points: also load the adapters installed under the ``foundry.engines`` entry-point group.
    require: check that the required hooks are implemented (InvalidArgumentError naming them).
    """
    pm = FoundryPluginManager()
    for adapter in adapters:
        pm.register_adapter(adapter)
    if entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    if require:
        pm.validate()
    return pm
