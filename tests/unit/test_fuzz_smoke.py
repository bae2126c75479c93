"""CI smoke run of the archive fuzzers (scripts/build-fuzz, csrc/tests/fuzz/).

Builds the libFuzzer targets (container, payload, image) with AddressSanitizer and
UndefinedBehaviorSanitizer into a temporary directory and fuzzes each for FOUNDRY_FUZZ_SECONDS
(default 20) seconds from its committed seeds: any crash, sanitizer report, leak or timeout fails
the test. Skipped, with the reason, where clang++ cannot link a -fsanitize=fuzzer program. The
long runs are `scripts/build-fuzz --target T --run 3600` (docs/archive-corruption.md).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-fuzz"
SECONDS = int(os.environ.get("FOUNDRY_FUZZ_SECONDS", "20"))
CXX = os.environ.get("FUZZ_CXX", "clang++")


@functools.lru_cache(maxsize=1)
def fuzzer_unavailable_reason() -> str | None:
    if shutil.which(CXX) is None:
        return f"{CXX} not found: libFuzzer needs clang (apt-get install clang, or set FUZZ_CXX)"
    with tempfile.TemporaryDirectory() as d:
        src = Path(d, "probe.cpp")
        src.write_text('extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n')
        proc = subprocess.run([CXX, "-fsanitize=fuzzer,address,undefined", str(src), "-o", str(Path(d, "probe"))],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return f"{CXX} cannot link a -fsanitize=fuzzer,address,undefined program (compiler-rt missing?): {last}"
    return None


@pytest.fixture(scope="module")
def fuzz_build(tmp_path_factory):
    """Builds every target once (scripts/build-fuzz without --run); the directory it built into."""
    reason = fuzzer_unavailable_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("fuzz")
    proc = subprocess.run([str(SCRIPT)], cwd=ROOT, env={**os.environ, "OUT": str(out)}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"scripts/build-fuzz exited {proc.returncode}\n{(proc.stdout + proc.stderr)[-6000:]}"
    return out


@pytest.mark.parametrize("target", ["container", "payload", "image"])
def test_fuzzer_finds_no_crash(fuzz_build, target):
    out = fuzz_build
    start = time.monotonic()
    proc = subprocess.run([str(out / f"fuzz_{target}"), f"-max_total_time={SECONDS}", "-print_final_stats=1",
                           str(out / "corpus" / target), str(out / "seeds" / target)], cwd=out,
                          capture_output=True, text=True, timeout=SECONDS + 120)
    log = proc.stdout + proc.stderr
    findings = sorted(p.name for p in out.glob("*") if p.name.startswith(("crash-", "leak-", "timeout-", "oom-")))
    assert not findings, f"the {target} fuzzer found inputs that break the parser: {findings}\n{log[-6000:]}"
    assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, log[-6000:]
    assert proc.returncode == 0, f"fuzz_{target} exited {proc.returncode}\n{log[-6000:]}"
    assert any(ln.startswith("Done ") for ln in log.splitlines()), f"fuzz_{target} did not run to its limit\n{log[-3000:]}"
    runs = int(next(ln for ln in log.splitlines() if ln.startswith("stat::number_of_executed_units:")).split()[-1])
    assert runs > 1000, f"fuzz_{target}: only {runs} executions"
    print(f"\nfuzz smoke {target}: {runs} executions in {time.monotonic() - start:.0f} s")
