"""Allocation-region behaviour in a fresh process. Usage: region_probe.py MODE [ARGS]"""

from __future__ import annotations

import json
import sys

import torch

import foundry_core as fdry
from _common import REGION_BASE, REGION_SIZE, emit, log_from_json, log_to_json

SIZES_MB = [1, 3, 8, 40, 2, 100]


def allocate(sizes_mb):
    # Large, distinct sizes: each becomes its own cudaMalloc in PyTorch's caching allocator.
    return [torch.empty(mb * (1 << 20) + 4096, dtype=torch.uint8, device="cuda") for mb in sizes_mb]


def mode_sequence(sizes_mb):
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    tensors = allocate(sizes_mb)
    torch.cuda.synchronize()
    return {
        "addresses": [t.data_ptr() for t in tensors],
        "log": log_to_json(fdry.allocation_log()),
        "info": fdry.region_info().__dict__,
        "counters": [fdry._native.lib().foundry_intercept_counter(i) for i in range(4)],
        "preload": bool(fdry._native.lib().foundry_preload_active()),
    }


def mode_expect(log_path, sizes_mb):
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    with open(log_path) as f:
        fdry.expect_allocation_log(log_from_json(json.load(f)))
    allocate(sizes_mb)
    d = fdry.allocation_divergence()
    return {"diverged": d is not None, "seq": d.seq if d else None, "message": str(d) if d else ""}


def mode_prealloc():
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    fdry.preallocate_region("1GiB")
    before = fdry.region.region_driver_calls()
    tensors = allocate([1, 3, 8, 40, 2, 100])
    torch.cuda.synchronize()
    after = fdry.region.region_driver_calls()
    x = tensors[3].view(torch.float32)
    x.fill_(2.0)
    ok = bool((x * 3).eq(6).all())
    return {"driver_calls_during_allocs": after - before, "values_ok": ok,
            "inside": all(REGION_BASE <= t.data_ptr() < REGION_BASE + (1 << 30) for t in tensors)}


def mode_stop():
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    a = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    fdry.stop_allocation_region()
    b = torch.empty(96 << 20, dtype=torch.uint8, device="cuda")
    fdry.resume_allocation_region()
    c = torch.empty(80 << 20, dtype=torch.uint8, device="cuda")

    def inside(t):
        return REGION_BASE <= t.data_ptr() < REGION_BASE + REGION_SIZE

    return {"before_stop_inside": inside(a), "while_stopped_inside": inside(b), "after_resume_inside": inside(c)}


def main():
    mode = sys.argv[1]
    if mode == "sequence":
        sizes = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES_MB
        emit(mode_sequence(sizes))
    elif mode == "expect":
        emit(mode_expect(sys.argv[2], [int(s) for s in sys.argv[3].split(",")]))
    elif mode == "prealloc":
        emit(mode_prealloc())
    elif mode == "stop":
        emit(mode_stop())
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
