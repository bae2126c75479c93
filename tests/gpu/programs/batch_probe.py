"""Decode graphs of the built-in model for many batch sizes: SAVE in one process, LOAD in another.

Usage: batch_probe.py save DIR N | load DIR N MODE [warm]

With ``warm`` the LOAD first grows the driver's exec memory (foundry_core.exec_memory.warm), as an
engine's start does on a thread while it loads weights; either way the device memory free before
and after each step is reported.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import torch

import foundry_core as fdry
from foundry_core.model.config import DecoderConfig
from foundry_core.model.decoder import DecodeRunner
from _common import REGION_BASE, REGION_SIZE, emit

CFG = DecoderConfig(hidden=512, heads=8, kv_heads=2, head_dim=64, intermediate=1408, layers=2, vocab=8192,
                    context=128, max_batch=64)


def digest(outputs) -> str:
    h = hashlib.sha256()
    for t in outputs:
        h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def replay_all(graphs, outputs, runner, sizes) -> dict:
    runner.reset(1234)
    out = {}
    for b in sizes:
        graphs[b].replay()
        out[b] = digest(outputs[b])
    torch.cuda.synchronize()
    return out


def save(directory: str, n: int) -> dict:
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    runner = DecodeRunner(CFG)
    sizes = list(range(n, 0, -1))  # largest first, as engines capture
    start = time.perf_counter()
    for b in sizes:  # warmup, as an engine does before capture
        runner.run(b)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    graphs, outputs = {}, {}
    for b in sizes:
        g = fdry.CUDAGraph()
        with fdry.graph(g, pool=pool):
            outputs[b] = runner.run(b)
        graphs[b] = g
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - start
    report = fdry.save_graphs(directory, {f"bs{b}": (graphs[b], list(outputs[b])) for b in sizes})
    size = int(subprocess.run(["du", "-sb", directory], capture_output=True, text=True).stdout.split()[0])
    return {"capture_s": capture_s, "save_s": report.seconds, "graphs": report.graphs, "groups": report.groups,
            "nodes": report.nodes, "images": report.images, "archive_bytes": size,
            "digests": replay_all(graphs, {b: list(o) for b, o in outputs.items()}, runner, sizes)}


def load(directory: str, n: int, mode: str, warm: bool = False) -> dict:
    from foundry_core import exec_memory

    torch.cuda.init()
    fdry.load_cuda_modules_and_libraries(directory)
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    runner = DecodeRunner(CFG)
    torch.cuda.synchronize()
    free = {"start": torch.cuda.mem_get_info()[0]}
    warmed = exec_memory.warm(f"{directory}/graphs.fgr") if warm else None
    free["warmed"] = torch.cuda.mem_get_info()[0]
    # "deferred": eager, with the odd batch sizes left for their first instantiate() or replay.
    defer = (lambda name: int(name.removeprefix("bs")) % 2 == 1) if mode == "deferred" else None
    start = time.perf_counter()
    archive = fdry.load_graphs(directory, mode="eager" if defer else mode, threads=8, defer=defer)
    ready_s = time.perf_counter() - start
    free["restored"] = torch.cuda.mem_get_info()[0]
    ready_after_load = {g.name: g.ready() for g in archive}
    instantiated = None
    if defer is not None:
        archive.get("bs2").instantiate()  # instantiated already: nothing to do
        archive.get("bs3").instantiate()  # one deferred graph now, the others at their replay
        instantiated = {name: archive.get(name).ready() for name in ("bs2", "bs3", "bs5")}
    first = archive.get(f"bs{n}")
    first.replay()
    torch.cuda.synchronize()
    first_replay_s = time.perf_counter() - start
    sizes = list(range(n, 0, -1))
    graphs = {b: archive.get(f"bs{b}") for b in sizes}
    outputs = {b: list(archive.outputs(graphs[b].index)) for b in sizes}
    digests = replay_all(graphs, outputs, runner, sizes)
    t = archive.times
    return {"ready_s": ready_s, "first_replay_s": first_replay_s, "groups": archive.groups,
            "times": {k: getattr(t, k) for k in ("images_s", "read_s", "claim_s", "build_s", "instantiate_s", "outputs_s")},
            "mapped_blocks": t.mapped_blocks, "existing_blocks": t.existing_blocks, "digests": digests, "free": free,
            "ready_after_load": ready_after_load, "instantiated": instantiated,
            "warm": None if warmed is None else {"execs": warmed.execs, "nodes": warmed.nodes, "seconds": warmed.seconds}}


if __name__ == "__main__":
    if sys.argv[1] == "save":
        emit(save(sys.argv[2], int(sys.argv[3])))
    else:
        emit(load(sys.argv[2], int(sys.argv[3]), sys.argv[4], warm=sys.argv[5:] == ["warm"]))
