"""What a result needs to be read later: the engine's version, the GPU, Foundry's version and
commit, the host. Each fact that cannot be found is None, never a guess."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

from foundry_core import __version__

_VERSION_OF = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def engine_version(python: str, distribution: str) -> str | None:
    """The installed version of ``distribution`` as ``python`` sees it (no engine import)."""
    return _run([python, "-c", _VERSION_OF, distribution])


def gpu() -> dict | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = _run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if not out:
        return None
    name, driver, memory = (part.strip() for part in (out.splitlines()[0].split(",") + ["", ""])[:3])
    return {"name": name, "driver": driver or None, "memory": memory or None, "count": len(out.splitlines())}


def git_commit() -> str | None:
    """The commit of the checkout foundry_core runs from, when it runs from one."""
    here = Path(__file__).resolve().parent
    commit = _run(["git", "rev-parse", "HEAD"], cwd=here)
    if commit is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here)
    return commit + ("+changes" if dirty else "")


def collect(python: str, distribution: str) -> dict:
    return {
        "engine_version": engine_version(python, distribution),
        "gpu": gpu(),
        "foundry_core_version": __version__,
        "git_commit": git_commit(),
        "python": python,
        "host": platform.node(),
        "platform": platform.platform(),
    }
