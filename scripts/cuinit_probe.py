"""Runs the SGLang fork server's imports (foundry_core.engine.fork_server.preload.import_all) with the driver's cuInit
traced: scripts/cuinit_trace/ is built and named in CUDA_INJECTION64_PATH, so the first cuInit
prints its thread and native stack, and faulthandler prints every thread's Python stack then.

Usage: python scripts/cuinit_probe.py  (SGLang's environment sourced; a GPU machine)
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def build() -> str:
    lib = os.path.join(os.environ.get("TMPDIR") or "/tmp", "libcuinit_trace.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", lib,
                    os.path.join(HERE, "cuinit_trace", "cuinit_trace.c")], check=True)
    return lib


def main() -> int:
    if "CUDA_INJECTION64_PATH" not in os.environ:
        env = dict(os.environ, CUDA_INJECTION64_PATH=build(), PYTORCH_NVML_BASED_CUDA_CHECK="1")
        return subprocess.call([sys.executable, __file__], env=env)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    from foundry_core.engine.fork_server import preload
    from sglang_foundry.fork_server_preload import MODULES

    start = time.perf_counter()
    timings: dict[str, float] = {}
    why = preload.import_all(MODULES, watch=lambda: preload.DriverWatch(stop=False), timings=timings)
    print(f"cuinit-probe: imports of {', '.join(MODULES)} took {time.perf_counter() - start:.1f} s "
          f"(checks after them {timings.get('checks_s', 0.0):.2f} s); unsafe: {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
