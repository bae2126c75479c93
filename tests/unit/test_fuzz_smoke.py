"""CI smoke run of the section-container fuzzer (scripts/build-fuzz, csrc/tests/fuzz/fuzz_container.cpp).

Builds the libFuzzer target with AddressSanitizer and UndefinedBehaviorSanitizer into a temporary
directory and fuzzes for FOUNDRY_FUZZ_SECONDS (default 20) seconds: any crash, sanitizer report,
leak or timeout fails the test. Skipped, with the reason, where clang++ cannot link a
-fsanitize=fuzzer program. The long run is `scripts/build-fuzz --run 3600` (docs/archive-corruption.md).
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


def test_container_fuzzer_finds_no_crash(tmp_path):
    reason = fuzzer_unavailable_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "fuzz"
    start = time.monotonic()
    proc = subprocess.run([str(SCRIPT), "--run", str(SECONDS)], cwd=ROOT, env={**os.environ, "OUT": str(out)},
                          capture_output=True, text=True, timeout=SECONDS + 150)
    log = proc.stdout + proc.stderr
    findings = sorted(p.name for p in out.glob("*") if p.name.startswith(("crash-", "leak-", "timeout-", "oom-")))
    assert not findings, f"the fuzzer found inputs that break the container parser: {findings}\n{log[-6000:]}"
    assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, log[-6000:]
    assert proc.returncode == 0, f"scripts/build-fuzz exited {proc.returncode}\n{log[-6000:]}"
    runs = [ln for ln in log.splitlines() if ln.startswith("Done ") and " runs in " in ln]
    assert runs, f"no 'Done N runs' line: the fuzzer did not run to its time limit\n{log[-3000:]}"
    assert int(runs[-1].split()[1]) > 1000, runs[-1]
    print(f"\nfuzz smoke: {runs[-1]} (total {time.monotonic() - start:.0f} s with the build)")
