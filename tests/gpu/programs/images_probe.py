"""Kernel-image capture and reload in fresh processes.

Usage: images_probe.py save DIR | load DIR MAPPING [eager|lazy|lazy-resolve-first]. With `lazy`,
the images are only read at first and the application's own loads come before any kernel is
resolved, so each image reaches the driver through the application's identical load; with
`lazy-resolve-first`, every kernel is resolved first (the images load then), and the application's
loads must get those handles.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

import torch

import foundry_core as fdry
from foundry_core import _native
from foundry_core.images import function_image, image_entries, resolve_function
from _common import emit


def workload():
    """cuBLAS (bf16 GEMM: nvjet kernels on Hopper), ATen elementwise/reduction, and Triton via torch.compile."""
    torch.manual_seed(0)
    a = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)

    @torch.compile(dynamic=False)
    def fused(x):
        return torch.nn.functional.silu(x) * 1.5 + x.sum(dim=-1, keepdim=True)

    def step():
        y = a @ b
        z = torch.relu(y).float().softmax(dim=-1)
        return fused(z)

    for _ in range(3):  # warm up: lazy loads, autotuning, compilation
        step()
    torch.cuda.synchronize()
    return step


def graph_functions(g: torch.cuda.CUDAGraph) -> list[int]:
    handle = g.raw_cuda_graph()
    count = ctypes.c_uint64()
    _native.call("foundry_graph_kernel_functions", handle, None, 0, ctypes.byref(count))
    arr = (ctypes.c_uint64 * count.value)()
    _native.call("foundry_graph_kernel_functions", handle, arr, count.value, ctypes.byref(count))
    return list(arr)


def save(directory: str) -> dict:
    step = workload()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        out = step()
    g.replay()
    torch.cuda.synchronize()
    mapping = []
    for f in graph_functions(g):
        h, name = function_image(f)
        mapping.append({"hash": h, "name": name})
    used = sorted({m["hash"] for m in mapping})
    images = fdry.loaded_images()
    fdry.pack_images(directory, used, arch=torch.cuda.get_device_capability()[0] * 10
                     + torch.cuda.get_device_capability()[1])
    by_hash = {i.hash: i for i in images}
    return {
        "images_seen": len(images),
        "image_kinds": sorted({i.kind for i in images}),
        "kernels_seen": sum(i.entry_count for i in images),
        "graph_kernels": mapping,
        "used_images": [{"hash": h, "kind": by_hash[h].kind, "entries": by_hash[h].entry_count} for h in used],
        "finite": bool(torch.isfinite(out).all()),
    }


def load(directory: str, mapping_path: str, how: str) -> dict:
    torch.cuda.init()
    torch.cuda.synchronize()
    start = time.perf_counter()
    n = fdry.load_cuda_modules_and_libraries(directory, lazy=how != "eager")
    load_seconds = time.perf_counter() - start
    with open(mapping_path) as f:
        mapping = json.load(f)

    def resolve_all() -> dict[str, bool]:
        return {m["name"]: resolve_function(m["hash"], m["name"]) != 0 for m in mapping}

    resolved = {} if how == "lazy" else resolve_all()
    # The application's own loads of the same images must be answered with the archived handles.
    step = workload()
    step()
    torch.cuda.synchronize()
    if how == "lazy":
        resolved = resolve_all()
    images = fdry.loaded_images()
    archived = {i.hash for i in images if i.from_archive}
    duplicates = [f"{i.hash:016x}" for i in images if not i.from_archive and i.hash in archived]
    names = {m["name"] for m in mapping}
    entries_ok = all(
        any(name in image_entries(i.hash, i.entry_count) for i in images if i.from_archive and i.hash == m["hash"])
        for m in mapping for name in [m["name"]]
    )
    return {"loaded": n, "load_seconds": load_seconds, "resolved": resolved, "duplicates": duplicates,
            "archived": len(archived), "distinct_kernels": len(names), "entries_ok": entries_ok}


if __name__ == "__main__":
    if sys.argv[1] == "save":
        emit(save(sys.argv[2]))
    else:
        emit(load(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "eager"))
