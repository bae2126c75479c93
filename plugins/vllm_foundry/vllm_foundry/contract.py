"""Checks the seams of ``seams.py`` against a vLLM source tree (parsed with ``ast``, never
imported) or against the installed vLLM (imported, plus the same source checks on its files).

Used by tests/engines/test_vllm_contract.py and by ``python -m vllm_foundry.contract`` (checks
the installed vLLM and prints a table). The checker itself is engine-agnostic
(:mod:`foundry_core.engine.contract`); these functions bind it to ``seams.TABLE``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from foundry_core.engine import contract as _contract
from foundry_core.engine.contract import (
    CHANGED,
    MOVED,
    OK,
    Reader,
    SeamResult,
    SourceTree,
    blocking,
    directory_reader,
)
from foundry_core.engine.seam import Seam

from vllm_foundry.seams import SEAMS, TABLE

__all__ = ["OK", "MOVED", "CHANGED", "Reader", "SeamResult", "SourceTree", "check_sources", "directory_reader",
           "installed_version", "installed_root", "check_installed", "format_table", "blocking", "main"]

# What is wrong with a seam in the imported vLLM, or None (the unit tests call it on a fake vLLM).
_check_import = _contract.check_import


def check_sources(read: Reader, seams: Iterable[Seam] = SEAMS) -> list[SeamResult]:
    """Checks each seam against the vLLM source tree behind ``read`` (relative path -> text or None)."""
    return _contract.check_sources(TABLE, read, seams)


def installed_version() -> str | None:
    """The installed vLLM's version, or None when vLLM is not installed."""
    return _contract.installed_version(TABLE)


def installed_root() -> Path | None:
    """The directory holding the installed ``vllm`` package, or None."""
    return _contract.installed_root(TABLE)


def check_installed(seams: Iterable[Seam] = SEAMS) -> list[SeamResult]:
    """Checks each seam in the installed vLLM: importable with the expected kind and parameters,
    and the same source checks as :func:`check_sources` on the installed files."""
    return _contract.check_installed(TABLE, seams)


def format_table(results: Iterable[SeamResult], version: str) -> str:
    """The results as an aligned table whose header names ``vllm <version>``."""
    return _contract.format_table(TABLE, results, version)


def main(argv: list[str] | None = None) -> int:
    """``python -m vllm_foundry.contract [SOURCE_DIR]``: checks the installed vLLM (or a source
    directory holding ``vllm/``) and prints the table; exit status 1 when a required seam failed."""
    return _contract.main(TABLE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
