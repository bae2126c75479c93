"""Checks the seams of ``seams.py`` against a TensorRT-LLM source tree (parsed with ``ast``, never
imported) or against the installed TensorRT-LLM (imported, plus the same source checks on its files).

Used by tests/engines/test_trtllm_contract.py and by ``python -m trtllm_foundry.contract
[SOURCE_DIR]`` (prints the table; exit status 1 when a required seam failed, 2 when TensorRT-LLM is
not installed and no directory was given). The checker is engine-agnostic
(:mod:`foundry_core.engine.contract`); these functions bind it to ``seams.TABLE``.
"""

from __future__ import annotations

from foundry_core.engine import contract as _contract
from foundry_core.engine.contract import CHANGED, MOVED, OK, PluginContract, Reader, SeamResult, blocking
from foundry_core.engine.contract import directory_reader

from trtllm_foundry.seams import TABLE

__all__ = ["OK", "MOVED", "CHANGED", "Reader", "SeamResult", "check_sources", "directory_reader", "check_import",
           "installed_version", "installed_root", "check_installed", "format_table", "blocking", "main"]

check_import = _contract.check_import  # what is wrong with one seam in the imported TensorRT-LLM, or None

CONTRACT = PluginContract(TABLE)
check_sources, check_installed = CONTRACT.check_sources, CONTRACT.check_installed
installed_version, installed_root = CONTRACT.installed_version, CONTRACT.installed_root
format_table, main = CONTRACT.format_table, CONTRACT.main


if __name__ == "__main__":
    raise SystemExit(main())
