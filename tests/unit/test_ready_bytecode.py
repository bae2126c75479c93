"""`foundry ready` records whether the engine's modules have bytecode: where none is there and
none is written (PYTHONDONTWRITEBYTECODE), every process of every start compiles them at import,
which a pip-installed engine does not, and the run says so."""

from __future__ import annotations

import py_compile
import shlex
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from foundry_core.ready import facts, report

MODULES = ("__init__", "core", "server")


def _installed(site: Path, *, compiled: tuple[str, ...]) -> None:
    """A package ``fakeengine`` in the site directory ``site``, with bytecode for this Python only
    for the modules named in ``compiled``."""
    package = site / "fakeengine"
    package.mkdir(parents=True)
    for name in MODULES:
        (package / f"{name}.py").write_text(f"NAME = {name!r}\n")
        if name in compiled:
            py_compile.compile(str(package / f"{name}.py"), doraise=True)


def _python_on(site: Path, tmp_path: Path, dont_write: bool) -> str:
    """A launcher for this Python with ``site`` on its path, as the engine's Python would be."""
    launcher = tmp_path / "python"
    flag = "export PYTHONDONTWRITEBYTECODE=1" if dont_write else "unset PYTHONDONTWRITEBYTECODE"
    launcher.write_text(f"#!/bin/sh\n{flag}\nexport PYTHONPATH={shlex.quote(str(site))}\n"
                        f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    launcher.chmod(0o755)
    return str(launcher)


def _fact(python: str) -> dict | None:
    return facts.engine_bytecode(python, ("fakeengine",))


def test_a_site_without_bytecode_where_none_is_written_is_counted_and_warned_of(tmp_path):
    site = tmp_path / "site"
    _installed(site, compiled=("core",))
    fact = _fact(_python_on(site, tmp_path, dont_write=True))
    assert fact == {"sites": [{"site": str(site), "modules": 3, "with_bytecode": 1}], "dont_write_bytecode": True}
    [warning] = facts.bytecode_missing(fact, "vllm")
    assert f"1 of 3 modules in {site}" in warning and f"compileall -q -j 0 {site}" in warning


def test_compiled_modules_or_a_python_that_writes_bytecode_are_no_warning(tmp_path):
    site = tmp_path / "site"
    _installed(site, compiled=MODULES)
    fact = _fact(_python_on(site, tmp_path, dont_write=True))
    assert fact["sites"][0]["with_bytecode"] == 3 and facts.bytecode_missing(fact, "vllm") == []
    # Uncompiled, but the first start writes the bytecode for every later one.
    unwritten = {"sites": [{"site": str(site), "modules": 3, "with_bytecode": 0}], "dont_write_bytecode": False}
    assert facts.bytecode_missing(unwritten, "vllm") == []


def test_compileall_on_the_site_clears_the_warning(tmp_path):
    site = tmp_path / "site"
    _installed(site, compiled=())
    python = _python_on(site, tmp_path, dont_write=True)
    assert facts.bytecode_missing(_fact(python), "vllm")
    subprocess.run([python, "-m", "compileall", "-q", str(site)], check=True)
    assert _fact(python)["sites"][0]["with_bytecode"] == 3 and facts.bytecode_missing(_fact(python), "vllm") == []


def test_packages_that_are_not_installed_count_no_site(tmp_path):
    assert facts.engine_bytecode(sys.executable, ("no_such_package_here",))["sites"] == []
    assert facts.bytecode_missing(None, "vllm") == []


def test_the_report_prints_the_warning_of_a_recorded_result():
    site = {"site": "/tmp/site", "modules": 2000, "with_bytecode": 0}
    result = {"engine": "sglang", "kinds": [], "starts": [], "summary": {},
              "environment": {"engine_bytecode": {"sites": [site], "dont_write_bytecode": True}}}
    console = Console(record=True, width=400)
    report.print_result(result, console)
    assert "sglang: 0 of 2000 modules in /tmp/site have bytecode" in console.export_text()
    site["with_bytecode"] = 2000
    console = Console(record=True, width=400)
    report.print_result(result, console)
    assert "bytecode" not in console.export_text()
