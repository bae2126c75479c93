"""sglang-foundry's fork server on a real GPU, over a synthetic ``sglang`` package (SGLang itself is
not needed): the fork server imports torch and maps the CUDA driver without initialising it, and
a child forked from it uses CUDA (the import asks the compute capability, as sgl_kernel's does); the safety probe tells a mapped driver from an initialised one.

Usage: fork_probe.py probe | fork WORKDIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "sglang_foundry"))

SCHEDULER = '''
import ctypes, json, os
import torch
ctypes.CDLL("libcuda.so.1")  # mapped, as an extension linked against the driver maps it
# What sgl_kernel asks at import to choose its kernels (which initialises CUDA unless answered
# otherwise); like sgl_kernel, it keeps the number, not the properties object (a kept answer of the
# fork server's stand-in makes the fork server unsafe).
def _import_capability():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.major * 10 + props.minor

IMPORT_CAPABILITY = _import_capability()
IMPORTED_IN = os.getpid()

def run_scheduler_process(out):
    x = torch.arange(1024, device="cuda", dtype=torch.float64)
    with open(out, "w") as f:
        major, minor = torch.cuda.get_device_capability()
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "imported_in": IMPORTED_IN,
                   "import_capability": IMPORT_CAPABILITY, "capability": major * 10 + minor,
                   "sum": float(x.sum().item()), "device": torch.cuda.get_device_name(0),
                   "preload": os.environ.get("LD_PRELOAD", "")}, f)
'''


def probe() -> dict:
    import ctypes

    import torch

    from foundry_core.engine.fork_server import preload

    ctypes.CDLL("libcuda.so.1")
    mapped = preload.unsafe_reason()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    initialised = preload.unsafe_reason()
    return {"mapped": mapped, "initialised": initialised}


def fork(workdir: str) -> dict:
    import multiprocessing

    root = Path(workdir)
    pkg = root / "sglang" / "srt" / "managers"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (root / "sglang", root / "sglang" / "srt", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "scheduler.py").write_text(SCHEDULER)
    (pkg / "detokenizer_manager.py").write_text("")
    sys.path.insert(0, str(root))
    from foundry_core.engine.fork_server import client as fs
    from sglang_foundry import fork_server

    fork_server.start()
    from sglang.srt.managers import scheduler

    out = str(root / "child.json")
    p = fs.ForkedProcess(target=scheduler.run_scheduler_process, args=(out,))
    p.start()
    p.join(300)
    child = json.loads(Path(out).read_text()) if p.exitcode == 0 else {}
    return {**child, "main": os.getpid(), "exitcode": p.exitcode, "status": fs._STATE.status(),
            "main_preload": os.environ.get("LD_PRELOAD", ""), "start_method": multiprocessing.get_start_method()}


if __name__ == "__main__":
    result = probe() if sys.argv[1] == "probe" else fork(sys.argv[2])
    print(json.dumps(result))
