"""`foundry ready` records whether the engine's modules have bytecode: where none is there and
none is written (PYTHONDONTWRITEBYTECODE), every process of every start compiles them at import,
which a pip-installed engine does not, and the run says so."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from foundry_core.ready import facts, report

MODULES = ("__init__", "core", "server")


def _installed(site: Path, *, compiled: tuple[str, ...]) -> None:
    """A distribution ``fakeengine`` installed as pip --target lays one out (its RECORD lists the
    modules), with bytecode for this Python only for the modules named in ``compiled``."""
    package = site / "fakeengine"
    package.mkdir(parents=True)
    for name in MODULES:
        (package / f"{name}.py").write_text(f"NAME = {name!r}\n")
        if name in compiled:
            py_compile.compile(str(package / f"{name}.py"), doraise=True)
    info = site / "fakeengine-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeengine\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"fakeengine/{n}.py,,\n" for n in MODULES) + "fakeengine-1.0.dist-info/RECORD,,\n")


def _python_on(site: Path, tmp_path: Path, dont_write: bool) -> str:
    """A launcher for this Python with ``site`` on its path, as the engine's Python would be."""
    launcher = tmp_path / "python"
    flag = "export PYTHONDONTWRITEBYTECODE=1" if dont_write else "unset PYTHONDONTWRITEBYTECODE"
    launcher.write_text(f"#!/bin/sh\n{flag}\nexport PYTHONPATH={site}\nexec {sys.executable} \"$@\"\n")
    launcher.chmod(0o755)
    return str(launcher)


def test_an_engine_without_bytecode_that_writes_none_is_counted_and_warned_of(tmp_path):
    site = tmp_path / "site"
    _installed(site, compiled=("core",))
    fact = facts.engine_bytecode(_python_on(site, tmp_path, dont_write=True), "fakeengine")
    assert fact == {"modules": 3, "with_bytecode": 1, "dont_write_bytecode": True}
    warning = facts.bytecode_missing(fact, "vllm")
    assert warning is not None and "1 of 3 modules" in warning and "PYTHONDONTWRITEBYTECODE" in warning


def test_compiled_modules_or_a_python_that_writes_bytecode_are_no_warning(tmp_path):
    site = tmp_path / "site"
    _installed(site, compiled=MODULES)
    fact = facts.engine_bytecode(_python_on(site, tmp_path, dont_write=True), "fakeengine")
    assert fact == {"modules": 3, "with_bytecode": 3, "dont_write_bytecode": True}
    assert facts.bytecode_missing(fact, "vllm") is None
    # Uncompiled, but the first start writes the bytecode for every later one.
    assert facts.bytecode_missing({"modules": 3, "with_bytecode": 0, "dont_write_bytecode": False}, "vllm") is None


def test_compileall_on_the_engines_packages_clears_the_warning(tmp_path):
    site = tmp_path / "site"
    _installed(site, compiled=())
    python = _python_on(site, tmp_path, dont_write=True)
    assert facts.bytecode_missing(facts.engine_bytecode(python, "fakeengine"), "vllm") is not None
    subprocess.run([python, "-m", "compileall", "-q", str(site)], check=True, env={**os.environ})
    assert facts.engine_bytecode(python, "fakeengine")["with_bytecode"] == 3


def test_a_distribution_that_is_not_installed_is_no_fact(tmp_path):
    assert facts.engine_bytecode(sys.executable, "no-such-distribution-here") is None
    assert facts.bytecode_missing(None, "vllm") is None


def test_the_report_prints_the_warning_of_a_recorded_result():
    result = {"engine": "sglang", "kinds": [], "starts": [], "summary": {},
              "environment": {"engine_bytecode": {"modules": 2000, "with_bytecode": 0, "dont_write_bytecode": True}}}
    console = Console(record=True, width=400)
    report.print_result(result, console)
    assert "sglang: 0 of 2000 modules have bytecode" in console.export_text()
    result["environment"]["engine_bytecode"]["with_bytecode"] = 2000
    console = Console(record=True, width=400)
    report.print_result(result, console)
    assert "bytecode" not in console.export_text()
