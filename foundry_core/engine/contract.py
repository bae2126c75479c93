"""Checks the seams of a :class:`~foundry_core.engine.seam.SeamTable` against an engine's source
tree (parsed with ``ast``, never imported) or against the installed engine (imported, plus the
same source checks on its files).

Each seam gets a :class:`SeamResult`: ``ok``, ``moved`` (the file or the attribute is not where
the seam says) or ``changed`` (its kind, parameters or body no longer match). Plugins wrap these
functions with their table (e.g. ``vllm_foundry.contract``) for their contract tests and for a
``python -m <plugin>.contract [SOURCE_DIR]`` command built on :func:`main`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from foundry_core.engine.seam import Seam, SeamTable

Reader = Callable[[str], "str | None"]

OK = "ok"
MOVED = "moved"        # the file or the attribute is not where the seam says
CHANGED = "changed"    # it exists, but its kind, parameters or body no longer match


@dataclass(frozen=True)
class SeamResult:
    """The outcome of one seam: ``status`` (OK, MOVED, CHANGED), ``location`` (``path:line``),
    ``detail`` (what no longer matches) and the parameters found (``signature``)."""

    seam: Seam
    status: str
    location: str = ""
    detail: str = ""
    signature: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


# ---- AST helpers ------------------------------------------------------------------------------


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _decorators(node: ast.AST) -> set[str]:
    out = set()
    for d in getattr(node, "decorator_list", []):
        name = _dotted(d.func if isinstance(d, ast.Call) else d)
        if name:
            out.add(name.rsplit(".", 1)[-1])
    return out


def _kind_of(node: ast.AST, in_class: bool) -> str:
    if isinstance(node, ast.ClassDef):
        return "class"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        decos = _decorators(node)
        if not in_class:
            return "function"
        for kind in ("staticmethod", "classmethod", "property"):
            if kind in decos:
                return kind
        return "method"
    return "constant"


def _params(node: ast.AST) -> list[str]:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def _find(tree: ast.Module, qualname: str) -> tuple[ast.AST | None, bool]:
    """The node defining ``qualname`` in ``tree`` (class, function, assignment or import) and
    whether its parent is a class."""
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    in_class = False
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        found = None
        for stmt in body:
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == part:
                found = stmt  # the last definition wins, as at import time
            elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == part for t in stmt.targets):
                found = stmt
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == part:
                found = stmt
            elif (isinstance(stmt, ast.ImportFrom) and i == 0
                  and any((al.asname or al.name) == part for al in stmt.names)):
                found = stmt
            elif (isinstance(stmt, ast.Import) and i == 0 and len(parts) == 1
                  and any((al.asname or al.name.split(".")[0]) == part for al in stmt.names)):
                found = stmt  # a module the engine imports under this name (`import multiprocessing as mp`)
        if found is None:
            return None, False
        node = found
        in_class = i > 0
        if i < len(parts) - 1:
            if not isinstance(found, ast.ClassDef):
                return None, False
            body = found.body
    return node, in_class


def _calls(node: ast.AST) -> set[str]:
    return {name for n in ast.walk(node) if isinstance(n, ast.Call) and (name := _dotted(n.func))}


def _self_assigns(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        targets: list[ast.AST] = []
        if isinstance(n, ast.Assign):
            targets = list(n.targets)
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign)):
            targets = [n.target]
        for t in targets:
            for tt in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(tt, ast.Subscript):
                    tt = tt.value
                if isinstance(tt, ast.Attribute) and isinstance(tt.value, ast.Name) and tt.value.id == "self":
                    out.add(tt.attr)
    return out


def _constant_value(node: ast.AST) -> object:
    value = getattr(node, "value", None)
    return value.value if isinstance(value, ast.Constant) else None


class SourceTree:
    """Parsed modules of one engine source tree, read through ``read(relative_path) -> text | None``."""

    def __init__(self, read: Reader):
        self._read = read
        self._cache: dict[str, tuple[str, ast.Module] | None] = {}

    def module(self, module: str) -> tuple[str, ast.Module] | None:
        if module not in self._cache:
            self._cache[module] = None
            for path in Seam.module_paths(module):
                text = self._read(path)
                if text is not None:
                    self._cache[module] = (path, ast.parse(text, filename=path))
                    break
        return self._cache[module]


def _called_by_name(mod: ast.Module, leaf: str) -> bool:
    """Whether ``mod`` calls ``leaf(...)`` by its bare name: replacing the module attribute then
    reaches that call."""
    return any(isinstance(n, ast.Name) and n.id == leaf for n in
               (c.func for c in ast.walk(mod) if isinstance(c, ast.Call)))


def _check_one(tree: SourceTree, s: Seam, read_only_modules: tuple[str, ...] = ()) -> SeamResult:
    parsed = tree.module(s.module)
    if parsed is None:
        return SeamResult(s, MOVED, detail=f"module {s.module} not found")
    path, mod = parsed
    if s.kind == "env":
        lines = [n.lineno for n in ast.walk(mod) if isinstance(n, ast.Constant) and n.value == s.qualname]
        if not lines:
            return SeamResult(s, MOVED, path, f"{s.qualname} is not mentioned in {path}")
        return SeamResult(s, OK, f"{path}:{lines[0]}")
    node, in_class = _find(mod, s.qualname)
    if node is None:
        return SeamResult(s, MOVED, path, f"{s.qualname} is not defined in {path}")
    location = f"{path}:{node.lineno}"
    if isinstance(node, ast.ImportFrom):  # imported by name: the definition is elsewhere
        if not s.defined_in:
            return SeamResult(s, CHANGED, location, f"{s.qualname} is imported here, the seam expects a definition")
        if s.kind == "function":
            leaf = s.qualname.rsplit(".", 1)[-1]
            if not _called_by_name(mod, leaf):
                return SeamResult(s, CHANGED, location, f"{path} no longer calls {leaf}() by name (replacing the "
                                                        "module attribute would have no effect)")
        home = tree.module(s.defined_in)
        if home is None:
            return SeamResult(s, MOVED, location, f"module {s.defined_in} not found")
        path, mod = home
        node, in_class = _find(mod, s.qualname.rsplit(".", 1)[-1])
        if node is None or isinstance(node, ast.ImportFrom):
            return SeamResult(s, MOVED, location, f"{s.qualname} is not defined in {path}")
        location = f"{path}:{node.lineno}"
    elif s.defined_in:
        return SeamResult(s, CHANGED, location, f"{s.qualname} is defined in {path}, no longer imported from "
                                                f"{s.defined_in}")
    kind = _kind_of(node, in_class)
    if s.kind == "enum":
        if kind != "class":
            return SeamResult(s, CHANGED, location, f"{s.qualname} is no longer a class")
        members = {t.id for st in node.body if isinstance(st, ast.Assign)
                   for t in st.targets if isinstance(t, ast.Name)}
        missing = [m for m in s.members if m not in members]
        if missing:
            return SeamResult(s, CHANGED, location, f"members missing: {', '.join(missing)}")
        return SeamResult(s, OK, location)
    if s.kind == "constant":
        value = _constant_value(node)
        if s.value is not None and value != s.value:
            return SeamResult(s, CHANGED, location, f"value is {value!r}, expected {s.value!r}")
        return SeamResult(s, OK, location)
    if kind != s.kind:
        return SeamResult(s, CHANGED, location, f"{s.qualname} is a {kind}, expected a {s.kind}")
    params = _params(node)
    signature = f"({', '.join(params)})"
    problems = []
    if tuple(params[:len(s.params)]) != s.params:
        problems.append(f"parameters {signature}, expected to start with ({', '.join(s.params)})")
    body_calls = _calls(node)
    missing_calls = [c for c in s.calls if c not in body_calls]
    if missing_calls:
        problems.append(f"no longer calls {', '.join(missing_calls)}")
    assigned = _self_assigns(node)
    missing_assigns = [a for a in s.assigns if a not in assigned]
    if missing_assigns:
        problems.append(f"no longer assigns self.{', self.'.join(missing_assigns)}")
    if s.kind == "function" and s.defined_in is None and not s.module.startswith(read_only_modules):
        leaf = s.qualname.rsplit(".", 1)[-1]
        if not _called_by_name(mod, leaf):
            problems.append(f"{path} no longer calls {leaf}() by name")
    if problems:
        return SeamResult(s, CHANGED, location, "; ".join(problems), signature)
    return SeamResult(s, OK, location, signature=signature)


def check_sources(table: SeamTable, read: Reader, seams: Iterable[Seam] | None = None) -> list[SeamResult]:
    """Checks each seam (default: all of ``table``'s) against the source tree behind ``read``
    (relative path -> text or None)."""
    tree = SourceTree(read)
    return [_check_one(tree, s, table.read_only_modules) for s in (table.seams if seams is None else seams)]


def directory_reader(root: str | Path) -> Reader:
    """A Reader over a directory that holds the engine's package (site-packages, an sdist root)."""
    base = Path(root)

    def read(path: str) -> str | None:
        p = base / path
        return p.read_text(encoding="utf-8") if p.is_file() else None

    return read


# ---- the installed engine ----------------------------------------------------------------------


def installed_version(table: SeamTable) -> str | None:
    """The installed engine's version, or None when its distribution is not installed."""
    from importlib import metadata

    try:
        return metadata.version(table.package)
    except metadata.PackageNotFoundError:
        return None


def _resolve(s: Seam) -> tuple[object, object]:
    """(owner, raw attribute) of an installed seam; raises AttributeError / ImportError."""
    owner: object = importlib.import_module(s.module)
    parts = s.qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    raw = inspect.getattr_static(owner, parts[-1])
    return owner, raw


def check_import(s: Seam) -> str | None:
    """What is wrong with the seam in the imported engine (kind, parameters), or None."""
    if s.kind == "env":
        return None  # checked in the source: reading it would evaluate the variable
    try:
        owner, raw = _resolve(s)
    except (ImportError, AttributeError) as exc:
        return f"cannot resolve {s.target}: {exc}"
    if s.kind in ("staticmethod", "classmethod", "property"):
        expected = {"staticmethod": staticmethod, "classmethod": classmethod, "property": property}[s.kind]
        if not isinstance(raw, expected):
            return f"{s.target} is a {type(raw).__name__}, expected a {s.kind}"
    if s.kind in ("function", "method", "staticmethod", "classmethod"):
        func = getattr(owner, s.qualname.rsplit(".", 1)[-1])
        try:
            params = list(inspect.signature(func if s.kind != "method" else raw).parameters)
        except (TypeError, ValueError) as exc:
            return f"cannot read the signature of {s.target}: {exc}"
        if s.kind == "classmethod":
            params = ["cls", *params]
        if tuple(params[:len(s.params)]) != s.params:
            return f"{s.target} takes ({', '.join(params)}), expected to start with ({', '.join(s.params)})"
    return None


def installed_root(table: SeamTable) -> Path | None:
    """The directory holding the installed engine package (``table.package``), or None."""
    spec = importlib.util.find_spec(table.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def check_installed(table: SeamTable, seams: Iterable[Seam] | None = None) -> list[SeamResult]:
    """Checks each seam (default: all of ``table``'s) in the installed engine: importable with the
    expected kind and parameters, and the same source checks as :func:`check_sources` on the
    installed files. ImportError when the engine is not installed."""
    root = installed_root(table)
    if root is None:
        raise ImportError(f"{table.engine} is not installed")
    out = []
    for result in check_sources(table, directory_reader(root), seams):
        problem = check_import(result.seam)
        if problem and result.ok:
            result = SeamResult(result.seam, CHANGED, result.location, problem, result.signature)
        elif problem:
            result = SeamResult(result.seam, result.status, result.location, f"{result.detail}; {problem}",
                                result.signature)
        out.append(result)
    return out


# ---- reporting ------------------------------------------------------------------------------


def format_table(table: SeamTable, results: Iterable[SeamResult], version: str) -> str:
    """One aligned row per result under a header naming the checked ``table.package`` ``version``."""
    rows = [("seam", "status", f"{table.package} {version}", "detail")]
    for r in results:
        rows.append((r.seam.name, r.status, r.location, r.detail or r.signature))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() for a, b, c, d in rows)


def blocking(results: Iterable[SeamResult]) -> list[SeamResult]:
    """The failed seams the plugin cannot work without."""
    return [r for r in results if not r.ok and r.seam.required]


def main(table: SeamTable, argv: list[str] | None = None) -> int:
    """A plugin's ``python -m <plugin>.contract [SOURCE_DIR]``: checks the installed engine (or a
    source directory holding its package) and prints the table. Exit status 0 when every required
    seam is fine, 1 when one failed, 2 when the engine is not installed."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        results, version = check_sources(table, directory_reader(args[0])), args[0]
    else:
        installed = installed_version(table)
        if installed is None:
            print(f"{table.engine} is not installed", file=sys.stderr)
            return 2
        results, version = check_installed(table), installed
    print(format_table(table, results, version))
    return 1 if blocking(results) else 0


class PluginContract:
    """The checks of this module bound to one plugin's seam table, for the plugin's ``contract``
    module (``CONTRACT = PluginContract(TABLE)``, then ``check_sources = CONTRACT.check_sources``
    and so on, and ``python -m <plugin>.contract [SOURCE_DIR]`` runs ``CONTRACT.main()``)."""

    def __init__(self, table: SeamTable) -> None:
        self.table = table

    def check_sources(self, read: Reader, seams: Iterable[Seam] | None = None) -> list[SeamResult]:
        """Checks each seam (default: all of the table's) against the engine source tree behind
        ``read`` (relative path -> text or None)."""
        return check_sources(self.table, read, seams)

    def installed_version(self) -> str | None:
        """The installed engine's version, or None when the engine is not installed."""
        return installed_version(self.table)

    def installed_root(self) -> Path | None:
        """The directory holding the installed engine package, or None."""
        return installed_root(self.table)

    def check_installed(self, seams: Iterable[Seam] | None = None) -> list[SeamResult]:
        """Checks each seam (default: all of the table's) in the installed engine: importable with
        the expected kind and parameters, and the same source checks as :meth:`check_sources` on
        the installed files. ImportError when the engine is not installed."""
        return check_installed(self.table, seams)

    def format_table(self, results: Iterable[SeamResult], version: str) -> str:
        """The results as an aligned table whose header names ``<package> <version>``."""
        return format_table(self.table, results, version)

    def main(self, argv: list[str] | None = None) -> int:
        """``python -m <plugin>.contract [SOURCE_DIR]``: checks the installed engine (or a source
        directory holding its package) and prints the table; exit status 0 when every required
        seam is fine, 1 when one failed, 2 when the engine is not installed."""
        return main(self.table, argv)
