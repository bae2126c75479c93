"""Seams: the declarative list of the places where an engine plugin touches its engine.

A plugin lists every engine attribute it wraps or reads as a :class:`Seam` and collects them in
one :class:`SeamTable` (engine name, distribution, tested versions). The same table drives the
patching (:class:`foundry_core.engine.patching.Patcher`) and the contract checks against the
installed engine and against release sources (:mod:`foundry_core.engine.contract`), so a seam that
moves upstream is reported by name instead of failing somewhere inside the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("function", "method", "staticmethod", "classmethod", "property", "enum", "constant", "env")


@dataclass(frozen=True)
class Seam:
    """One engine attribute the plugin relies on.

    - ``module`` / ``qualname``: the attribute the plugin wraps or reads (``Worker.init_device``);
    - ``kind``: one of :data:`KINDS`;
    - ``purpose``: why the plugin needs it (quoted in every error about the seam);
    - ``params``: the leading parameter names the wrapper relies on (more may follow);
    - ``defined_in``: where a function is defined when ``module`` imports it by name (the plugin
      replaces the importing module's attribute, so that module must call it by its bare name);
    - ``calls``: dotted names the body must call (e.g. a constructor the plugin swaps);
    - ``assigns``: ``self`` attributes the body must assign (state the plugin reads or restores);
    - ``members`` / ``value``: enum members or a constant's value;
    - ``required``: False when the plugin degrades gracefully without it (not a blocking failure).
    """

    name: str
    module: str
    qualname: str
    kind: str
    purpose: str
    params: tuple[str, ...] = ()
    defined_in: str | None = None
    calls: tuple[str, ...] = ()
    assigns: tuple[str, ...] = ()
    members: tuple[str, ...] = ()
    value: str | None = None
    required: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"seam {self.name}: unknown kind {self.kind!r}; expected one of {', '.join(KINDS)}")

    @property
    def target(self) -> str:
        """``module.qualname``, as the messages name it."""
        return f"{self.module}.{self.qualname}"

    @property
    def source_module(self) -> str:
        """The module whose source defines the seam."""
        return self.defined_in or self.module

    @staticmethod
    def module_paths(module: str) -> tuple[str, str]:
        """Where ``module``'s source may be, relative to site-packages or an sdist's root: a module
        file or a package's ``__init__.py``."""
        base = module.replace(".", "/")
        return base + ".py", base + "/__init__.py"


@dataclass(frozen=True)
class SeamTable:
    """Every seam of one engine plugin, with what the messages and checks need about the engine.

    - ``engine``: the engine's display name in messages ("vLLM");
    - ``package``: its distribution and top-level package name ("vllm");
    - ``tested_versions``: the releases the seams were checked against (quoted in errors);
    - ``seams``: the seams; names must be unique;
    - ``read_only_modules``: module prefixes whose function seams the plugin only checks or
      calls, or wraps where the engine calls them through the module from other modules
      (``envs.compile_factors()``), so the contract does not require their module to call them
      by bare name.
    """

    engine: str
    package: str
    tested_versions: tuple[str, ...]
    seams: tuple[Seam, ...]
    read_only_modules: tuple[str, ...] = ()
    by_name: dict[str, Seam] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Seam] = {}
        for s in self.seams:
            if s.name in by_name:
                raise ValueError(f"{self.engine} seam {s.name!r} is listed twice; seam names must be unique")
            by_name[s.name] = s
        object.__setattr__(self, "by_name", by_name)  # frozen: derived once from ``seams``

    def seam(self, name: str) -> Seam:
        """The seam called ``name``; KeyError naming the known ones otherwise."""
        try:
            return self.by_name[name]
        except KeyError:
            known = ", ".join(sorted(self.by_name))
            raise KeyError(f"no {self.engine} seam named {name!r}; known: {known}") from None

    def source_files(self) -> list[str]:
        """Every file (relative path, module or package form) a seam may live in, for the source
        contract check; only some of them exist."""
        return sorted({p for s in self.seams for m in (s.module, s.source_module) for p in Seam.module_paths(m)})

    def version(self) -> str:
        """The installed engine's version (``"unknown"`` when it cannot be read: messages only)."""
        try:
            from importlib import metadata

            return metadata.version(self.package)
        except Exception:  # noqa: BLE001 - a version string for messages only
            return "unknown"
