"""scripts/vllm-check and scripts/sglang-check: every step the usage names exists, every step
function is named in the usage, and the scripts parse."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
USAGE_LINE = re.compile(r"^#   ([a-z0-9-]+)\s{2,}")  # "#   timing-8b   Qwen3-8B layer shapes: ..."


def usage_steps(text: str) -> set[str]:
    header = text.split("\nset -", 1)[0]
    return {m.group(1) for line in header.splitlines() if (m := USAGE_LINE.match(line))}


def step_functions(text: str) -> set[str]:
    return {name.replace("_", "-") for name in re.findall(r"^step_([a-z0-9_]+)\(\)", text, re.MULTILINE)}


@pytest.mark.parametrize("script", ["vllm-check", "sglang-check"])
def test_usage_and_step_functions_agree(script):
    text = (SCRIPTS / script).read_text()
    named, defined = usage_steps(text), step_functions(text)
    assert named, f"{script}: no steps found in the usage"
    assert named == defined, f"{script}: in the usage only {sorted(named - defined)}, defined only {sorted(defined - named)}"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("script", ["vllm-check", "sglang-check", "gpu-check", "build-fuzz"])
def test_script_parses(script):
    result = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
