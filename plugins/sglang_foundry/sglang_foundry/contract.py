"""Checks the seams of ``seams.py`` against an SGLang source tree (parsed with ``ast``, never
imported) or against the installed SGLang (imported, plus the same source checks on its files).

Used by tests/engines/test_sglang_contract.py and by ``python -m sglang_foundry.contract
[SOURCE_DIR]`` (prints the table; exit status 1 when a required seam failed, 2 when SGLang is not
installed and no directory was given). The checker is engine-agnostic
(:mod:`foundry_core.engine.contract`); these functions bind it to ``seams.TABLE``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from foundry_core.engine import contract as _contract
from foundry_core.engine.contract import CHANGED, MOVED, OK, Reader, SeamResult, blocking, directory_reader
from foundry_core.engine.seam import Seam

from sglang_foundry.seams import SEAMS, TABLE

__all__ = ["OK", "MOVED", "CHANGED", "Reader", "SeamResult", "check_sources", "directory_reader", "check_import",
           "installed_version", "installed_root", "check_installed", "format_table", "blocking", "main"]

check_import = _contract.check_import  # what is wrong with one seam in the imported SGLang, or None


def check_sources(read: Reader, seams: Iterable[Seam] = SEAMS) -> list[SeamResult]:
    """Checks each seam against the SGLang source tree behind ``read`` (relative path -> text or None)."""
    return _contract.check_sources(TABLE, read, seams)


def installed_version() -> str | None:
    """The installed SGLang's version, or None when SGLang is not installed."""
    return _contract.installed_version(TABLE)


def installed_root() -> Path | None:
    """The directory holding the installed ``sglang`` package, or None."""
    return _contract.installed_root(TABLE)


def check_installed(seams: Iterable[Seam] = SEAMS) -> list[SeamResult]:
    """Checks each seam in the installed SGLang (imported) and in its installed source files."""
    return _contract.check_installed(TABLE, seams)


def format_table(results: Iterable[SeamResult], version: str) -> str:
    """The results as an aligned table whose header names ``sglang <version>``."""
    return _contract.format_table(TABLE, results, version)


def main(argv: list[str] | None = None) -> int:
    """``python -m sglang_foundry.contract [SOURCE_DIR]``."""
    return _contract.main(TABLE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
