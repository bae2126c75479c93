"""`foundry demo` end to end on a GPU: SAVE and LOAD in child processes, outputs identical."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def test_foundry_demo_end_to_end():
    out = subprocess.run([sys.executable, "-m", "foundry_core.cli", "demo"], capture_output=True, text=True,
                         timeout=600)
    print(out.stdout[-3000:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "256" in out.stdout and "yes" in out.stdout and "NO" not in out.stdout
