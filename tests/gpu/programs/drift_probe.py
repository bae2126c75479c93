"""Environment drift and allocation divergence at LOAD, for the GPU tests.

Usage: drift_probe.py save DIR               a small graph saved with its fingerprint
       drift_probe.py load DIR [EXTRA_BYTES] LOAD; EXTRA_BYTES > 0 allocates one more buffer before
                                              the inputs, so they land elsewhere than at SAVE
Prints what LOAD did: restored, or the error's type and message, and whether any graph replayed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import foundry_core as fdry
from _common import REGION_BASE, REGION_SIZE, emit


def inputs():
    torch.manual_seed(0)
    return torch.randn(1 << 16, device="cuda"), torch.randn(1 << 16, device="cuda")


def save(directory: str) -> dict:
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    x, y = inputs()
    torch.cuda.synchronize()
    g = fdry.CUDAGraph()
    with fdry.graph(g):
        out = torch.tanh(x) * y + 1.0
    g.save(Path(directory) / "graph.json", output_tensors=out)
    return {"saved": True}


def load(directory: str, extra_bytes: int) -> dict:
    torch.cuda.init()
    fdry.load_cuda_modules_and_libraries(directory)
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    extra = torch.empty(extra_bytes, dtype=torch.uint8, device="cuda") if extra_bytes else None
    x, y = inputs()
    try:
        g, out = fdry.CUDAGraph.load(Path(directory) / "graph.json")
    except fdry.FoundryError as exc:
        return {"restored": False, "replayed": False, "error": type(exc).__name__, "message": str(exc)}
    g.replay()
    torch.cuda.synchronize()
    expected = torch.tanh(x) * y + 1.0
    del extra
    return {"restored": True, "replayed": True, "identical": bool(torch.equal(out, expected))}


if __name__ == "__main__":
    if sys.argv[1] == "save":
        emit(save(sys.argv[2]))
    else:
        emit(load(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0))
