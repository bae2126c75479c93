"""The original Foundry README's other calls, used as it shows them, in fresh processes.

Usage: seed_api_probe.py save DIR | load DIR single|async

SAVE sets a region of ``parse_size('16GB')`` (not a multiple of the allocation granularity) at
the README's base, fast-forwards the cursor with ``set_current_alloc_offset``, captures one graph
per batch size, saves each as ``DIR/graph_<i>.json`` and writes ``graph_manifest.json`` with
``save_graph_manifest(DIR)``. LOAD ``single`` restores ``graph_0.json`` with ``CUDAGraph.load``
inside ``allocation_region(base, '16GB', prealloc_size='8GB')``, as the README's preallocation
example; LOAD ``async`` sets the region, calls ``preallocate_region('8GB')`` and restores every
graph with ``start_graph_builds`` / ``finish_one_graph_load`` / ``finish_graph_loads``, then
``init_nvshmem_for_loaded_modules``. Both write the same fresh inputs, replay, and hash outputs.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch

import foundry_core as fdry
from foundry_core.region import region_driver_calls
from _common import emit

BASE = 0x500000000000  # the README's preallocation example
REGION = "16GB"
PREALLOC = "8GB"
SKIP_TO = "64MiB"  # where set_current_alloc_offset moves the cursor, before any buffer
SIZES = [4, 2, 1]


def buffers() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(max(SIZES), 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")


def step(x: torch.Tensor, w: torch.Tensor, b: int) -> torch.Tensor:
    return torch.relu(x[:b] @ w).sum(dim=-1) + x[:b, 0]


def paths(directory: str) -> list[Path]:
    return [Path(directory) / f"graph_{i}.json" for i in range(len(SIZES))]


def skip_ahead() -> dict:
    """Fast-forwards the cursor and reads it back."""
    before = fdry.get_current_alloc_offset()
    fdry.set_current_alloc_offset(SKIP_TO)
    return {"offset_before": before, "offset_after": fdry.get_current_alloc_offset()}


def replay(restored: list[tuple], x: torch.Tensor) -> list[str]:
    x.copy_(torch.randn(x.shape, generator=torch.Generator(device="cuda").manual_seed(1234), device="cuda"))
    out = []
    for g, o in restored:
        g.replay()
        torch.cuda.synchronize()
        out.append(hashlib.sha256(o.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest())
    return out


def save(directory: str) -> dict:
    torch.cuda.init()
    fdry.set_allocation_region(BASE, fdry.parse_size(REGION))
    cursor = skip_ahead()
    x, w = buffers()
    for b in SIZES:
        step(x, w, b)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    captured = []
    for b, path in zip(SIZES, paths(directory)):
        g = fdry.CUDAGraph()
        with fdry.graph(g, pool=pool):
            out = step(x, w, b)
        g.replay()
        g.save(str(path), output_tensors=out)
        captured.append((g, out))
    manifest = fdry.save_graph_manifest(directory)
    info = fdry.region_info()
    result = {**cursor, "first_buffer": x.data_ptr(), "region_size": info.size, "manifest": str(manifest),
              "digests": replay(captured, x)}
    fdry.stop_allocation_region()
    return result


def load_single(directory: str) -> dict:
    torch.cuda.init()
    with fdry.allocation_region(BASE, REGION, prealloc_size=PREALLOC):
        cursor = skip_ahead()
        calls = region_driver_calls()
        x, w = buffers()
        torch.cuda.synchronize()
        calls = region_driver_calls() - calls
        graph, output = fdry.CUDAGraph.load(str(paths(directory)[0]))
        active_inside = fdry.region_info().active
    active_after = fdry.region_info().active
    return {**cursor, "first_buffer": x.data_ptr(), "driver_calls_for_buffers": calls, "active_inside": active_inside,
            "active_after": active_after, "digests": replay([(graph, output)], x)}


def load_async(directory: str) -> dict:
    torch.cuda.init()
    fdry.set_allocation_region(BASE, fdry.parse_size(REGION))
    fdry.preallocate_region(PREALLOC)
    cursor = skip_ahead()
    x, w = buffers()
    pending = fdry.CUDAGraph.start_graph_builds([str(p) for p in paths(directory)], num_threads=24)
    first = fdry.CUDAGraph.finish_one_graph_load(pending, 0)
    restored = fdry.CUDAGraph.finish_graph_loads(pending)
    nvshmem = fdry.init_nvshmem_for_loaded_modules()
    digests = replay(restored, x)
    fdry.stop_allocation_region()
    return {**cursor, "first_buffer": x.data_ptr(), "first_is_graph_0": first[0].name == "graph_0",
            "nvshmem_initialised": nvshmem, "digests": digests}


if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    if mode == "save":
        emit(save(directory))
    elif sys.argv[3:] == ["single"]:
        emit(load_single(directory))
    elif sys.argv[3:] == ["async"]:
        emit(load_async(directory))
    else:
        raise SystemExit(__doc__)
