"""What a result needs to be read later: the engine's version and whether its modules have
bytecode, the GPU, Foundry's version and commit, the host. Each fact that cannot be found is None,
never a guess."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

from foundry_core import __version__

_VERSION_OF = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
# The distribution's modules, those with bytecode for this Python, and whether it writes none.
_BYTECODE_OF = """
import importlib.metadata as m, importlib.util as u, os, sys
files = [f for f in m.distribution(sys.argv[1]).files or [] if f.suffix == ".py"]
print(len(files), sum(os.path.exists(u.cache_from_source(str(f.locate()))) for f in files), int(sys.dont_write_bytecode))
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


def engine_bytecode(python: str, distribution: str) -> dict | None:
    """How many of ``distribution``'s modules have bytecode for ``python``, and whether ``python``
    writes none (``PYTHONDONTWRITEBYTECODE``): both together mean every process of every start
    compiles them again at import, which a default pip install (it writes the bytecode) spares."""
    out = _run([python, "-c", _BYTECODE_OF, distribution])
    try:
        modules, cached, dont_write = (int(n) for n in (out or "").split())
    except ValueError:
        return None
    return {"modules": modules, "with_bytecode": cached, "dont_write_bytecode": bool(dont_write)}


def bytecode_missing(fact: dict | None, engine: str) -> str | None:
    """A warning when most of the engine's modules have no bytecode and none is written (see
    :func:`engine_bytecode`): such starts are slower than a pip-installed engine's; else None."""
    if not fact or not fact.get("dont_write_bytecode") or fact["with_bytecode"] * 2 >= fact["modules"]:
        return None
    return (f"{engine}: {fact['with_bytecode']} of {fact['modules']} modules have bytecode and "
            "PYTHONDONTWRITEBYTECODE is set, so every process of every start compiles them at import, "
            "which a default pip install does not (`python -m compileall` on the engine's packages writes it)")


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
        "engine_bytecode": engine_bytecode(python, distribution),
        "gpu": gpu(),
        "foundry_core_version": __version__,
        "git_commit": git_commit(),
        "python": python,
        "host": platform.node(),
        "platform": platform.platform(),
    }
