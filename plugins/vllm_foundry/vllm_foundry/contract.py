"""Checks the seams of ``seams.py`` against a vLLM source tree (parsed with ``ast``, never
imported) or against the installed vLLM (imported, plus the same source checks on its files).

Used by tests/engines/test_vllm_contract.py and by ``python -m vllm_foundry.contract`` (checks
the installed vLLM and prints a table). The checker itself is engine-agnostic
(:mod:`foundry_core.engine.contract`); these functions bind it to ``seams.TABLE``.
"""

from __future__ import annotations

from foundry_core.engine import contract as _contract
from foundry_core.engine.contract import CHANGED, MOVED, OK, PluginContract, Reader, SeamResult, SourceTree
from foundry_core.engine.contract import blocking, directory_reader

from vllm_foundry.seams import TABLE

__all__ = ["OK", "MOVED", "CHANGED", "Reader", "SeamResult", "SourceTree", "check_sources", "directory_reader",
           "installed_version", "installed_root", "check_installed", "format_table", "blocking", "main"]

# What is wrong with a seam in the imported vLLM, or None (the unit tests call it on a fake vLLM).
_check_import = _contract.check_import

# The checks of foundry_core.engine.contract bound to vLLM's seam table (``vllm <version>`` in the
# table's header); ``main`` is ``python -m vllm_foundry.contract [SOURCE_DIR]`` (exit status 1
# when a required seam failed).
CONTRACT = PluginContract(TABLE)
check_sources, check_installed = CONTRACT.check_sources, CONTRACT.check_installed
installed_version, installed_root = CONTRACT.installed_version, CONTRACT.installed_root
format_table, main = CONTRACT.format_table, CONTRACT.main


if __name__ == "__main__":
    raise SystemExit(main())
