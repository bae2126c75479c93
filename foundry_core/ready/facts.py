"""What a result needs to be read later: the engine's version and whether its modules have
bytecode, the GPU, Foundry's version and commit, the host. Each fact that cannot be found is None,
never a guess."""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from foundry_core import __version__

_VERSION_OF = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
# Per site directory holding one of the named packages: its modules and those with bytecode for
# this Python; then whether this Python writes none. find_spec imports none of the packages.
_BYTECODE_OF = """
import importlib.util as u, os, sys
sites = []
for name in sys.argv[1:]:
    spec = u.find_spec(name)
    if spec and spec.submodule_search_locations:
        site = os.path.dirname(list(spec.submodule_search_locations)[0])
        sites += [site] if site not in sites else []
for site in sites:
    modules = cached = 0
    for root, dirs, files in os.walk(site):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                modules += 1
                cached += os.path.exists(u.cache_from_source(os.path.join(root, f)))
    print(modules, cached, site)
print(int(sys.dont_write_bytecode))
"""


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def engine_version(python: str, distribution: str) -> str | None:
    """The installed version of ``distribution`` as ``python`` sees it (no engine import)."""
    return _run([python, "-c", _VERSION_OF, distribution])


def engine_bytecode(python: str, packages: Sequence[str]) -> dict | None:
    """For each site directory that holds one of ``packages`` (the engine's, torch's), how many of
    its modules have bytecode for ``python``; and whether ``python`` writes none
    (``PYTHONDONTWRITEBYTECODE`` or ``-B``). Modules without bytecode where none is written are
    compiled again at import by every process of every start; a default pip install writes it."""
    out = _run([python, "-c", _BYTECODE_OF, *packages])
    lines = (out or "").splitlines()
    try:
        sites = [{"site": site, "modules": int(modules), "with_bytecode": int(cached)}
                 for modules, cached, site in (line.split(" ", 2) for line in lines[:-1])]
        return {"sites": sites, "dont_write_bytecode": bool(int(lines[-1]))}
    except (IndexError, ValueError):
        return None


def bytecode_missing(fact: dict | None, engine: str) -> list[str]:
    """A warning per site directory of :func:`engine_bytecode` where most modules have no bytecode
    and none is written: its starts import those modules slower than from a pip install."""
    if not fact or not fact.get("dont_write_bytecode"):
        return []
    return [f"{engine}: {site['with_bytecode']} of {site['modules']} modules in {site['site']} have bytecode and "
            "none is written (PYTHONDONTWRITEBYTECODE or -B): every process compiles those it imports, at every "
            f"start; `python -m compileall -q -j 0 {site['site']}` writes it, as a pip install does"
            for site in fact.get("sites") or () if site["with_bytecode"] * 2 < site["modules"]]


def gpu() -> dict | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = _run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if not out:
        return None
    name, driver, memory = (part.strip() for part in (out.splitlines()[0].split(",") + ["", ""])[:3])
    return {"name": name, "driver": driver or None, "memory": memory or None, "count": len(out.splitlines())}


# Filled in by `git archive` (export-subst in .gitattributes): a tree exported without its
# history still says which commit it is.
COMMIT_FILE = "COMMIT"


def git_commit(package_dir: Path | None = None) -> str | None:
    """The commit foundry_core runs from: its checkout's (``+changes`` when tracked files differ),
    or, in a tree exported by ``git archive`` (no checkout of its own: an enclosing repository's
    HEAD would be another commit), the one written into ``foundry_core/COMMIT``; else None."""
    here = (package_dir or Path(__file__).resolve().parent.parent).resolve()
    top = _run(["git", "rev-parse", "--show-toplevel"], cwd=here)
    if top is not None and Path(top).resolve() == here.parent:
        commit = _run(["git", "rev-parse", "HEAD"], cwd=here)
        if commit is not None:
            dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here)
            return commit + ("+changes" if dirty else "")
    try:
        written = (here / COMMIT_FILE).read_text().strip()
    except OSError:
        return None
    return written if written and not written.startswith("$Format") else None


def collect(python: str, distribution: str) -> dict:
    return {
        "engine_version": engine_version(python, distribution),
        "engine_bytecode": engine_bytecode(python, (distribution.replace("-", "_"), "torch")),
        "gpu": gpu(),
        "foundry_core_version": __version__,
        "git_commit": git_commit(),
        "python": python,
        "host": platform.node(),
        "platform": platform.platform(),
    }
