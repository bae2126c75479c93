"""Shared test fixtures: GPU detection and running Python programs under the preload."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Shared test bodies live in these helper modules: rewrite their asserts so failures show values.
pytest.register_assert_rewrite("plugin_support", "pypi_sources")

TESTS_DIR = Path(__file__).resolve().parent
PROGRAMS_DIR = TESTS_DIR / "gpu" / "programs"


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver (libcuda.so.1 not found)"
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "the NVIDIA driver reports no usable GPU"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "PyTorch is not installed"
    return None


@pytest.fixture(autouse=True)
def _collector_back_on():
    """A test that ran an early start paused this process's garbage collector (as the engine's
    main process pauses it over its imports): it is on again for the next test."""
    yield
    from foundry_core.engine.fork_server import main_gc

    main_gc.resume("the test ended", freeze=False)


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_program(name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """Runs tests/gpu/programs/<name>.py in a fresh process under the preload; returns its JSON."""
    from foundry_core.preload import preload_environment

    full_env = preload_environment(env or os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.run([sys.executable, str(PROGRAMS_DIR / f"{name}.py"), *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
                             f"stderr:\n{proc.stderr[-8000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"{name} printed no JSON result\nstderr:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])


@pytest.fixture
def report(record_property):
    """Prints a line for the reader and keeps it in the JUnit XML as a ``report`` property (under
    pytest-xdist, as scripts/gpu-check may run the GPU suite, printed output is not shown)."""

    def say(text: str) -> None:
        print(text)
        record_property("report", text.strip())

    return say


@pytest.fixture
def program():
    return run_program
