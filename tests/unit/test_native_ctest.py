"""Builds the native unit tests (csrc/tests) with CMake and runs them with ctest."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_native_unit_tests_pass(tmp_path_factory):
    build = tmp_path_factory.mktemp("ctest-build")
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DFOUNDRY_BUILD_TESTS=ON"], check=True,
                   capture_output=True, text=True)
    b = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True)
    assert b.returncode == 0, b.stdout[-4000:] + b.stderr[-4000:]
    t = subprocess.run(["ctest", "--output-on-failure"], cwd=build, capture_output=True, text=True)
    assert t.returncode == 0, t.stdout[-6000:]
    assert "tests passed" in t.stdout
