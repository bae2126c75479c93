"""Tensor parallel with an NCCL all-reduce inside CUDA graphs, SAVE and LOAD on every rank.

Usage (one process per GPU, under the preload): torchrun --nproc-per-node 2 tp_probe.py save|load DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import foundry_core as fdry
from _common import REGION_BASE, REGION_SIZE, graph_shape, kernel_launches, nccl_kernel_args, template_graph

SIZES = (1, 4, 16, 64)
HIDDEN, INTER = 4096, 12288


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def replay_ms(replay, n: int = 50) -> float:
    """Median replay time in milliseconds (CUDA events around each replay)."""
    for _ in range(5):
        replay()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[n // 2]


def bring_up(rank: int) -> None:
    """NCCL's communicator and its connections, outside the region (their layout varies)."""
    fdry.stop_allocation_region()
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    x = torch.ones(1024, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    del x
    torch.cuda.empty_cache()  # so no block allocated outside the region is handed out later
    fdry.resume_allocation_region()


def layer(world: int):
    torch.manual_seed(0)
    dt = torch.bfloat16
    w_up = torch.randn(HIDDEN, INTER // world, device="cuda", dtype=dt) * 0.02
    w_down = torch.randn(INTER // world, HIDDEN, device="cuda", dtype=dt) * 0.02
    x = torch.randn(max(SIZES), HIDDEN, device="cuda", dtype=dt)

    def step(b: int) -> torch.Tensor:
        h = torch.nn.functional.silu(x[:b] @ w_up) @ w_down
        dist.all_reduce(h)
        return h + x[:b]
    return x, step


def main() -> None:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    torch.cuda.init()
    mine = directory / f"rank{rank}"
    if mode == "load":
        fdry.load_cuda_modules_and_libraries(mine)
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    bring_up(rank)
    x, step = layer(world)
    result: dict = {"rank": rank, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    if mode == "save":
        for b in SIZES:
            step(b)
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        graphs, outs = {}, {}
        start = time.perf_counter()
        for b in sorted(SIZES, reverse=True):
            g = fdry.CUDAGraph()
            with fdry.graph(g, pool=pool):
                outs[b] = step(b)
            graphs[f"b{b}"] = (g, outs[b])
        result["capture_s"] = time.perf_counter() - start
        try:
            fdry.save_graphs(mine, graphs)
            result["saved"] = True
        except fdry.FoundryError as exc:
            result.update(error=type(exc).__name__, message=str(exc)[:3000])
        torch.manual_seed(100 + rank)
        x.copy_(torch.randn_like(x))
        for name, (g, _) in graphs.items():
            g.replay()
        torch.cuda.synchronize()
        result["digests"] = {f"b{b}": digest(outs[b]) for b in SIZES}
        result["replay_ms"] = {name: replay_ms(g.replay) for name, (g, _) in graphs.items()}
        result["launches"] = {name: kernel_launches(g.raw_cuda_graph()) for name, (g, _) in graphs.items()}
        result["shapes"] = {name: graph_shape(g.raw_cuda_graph()) for name, (g, _) in graphs.items()}
        result["nccl_args"] = {name: nccl_kernel_args(g.raw_cuda_graph()) for name, (g, _) in graphs.items()}
    else:
        start = time.perf_counter()
        archive = fdry.load_graphs(mine)
        result["restore_s"] = time.perf_counter() - start
        result["nccl_events"] = archive.times.nccl_events
        torch.manual_seed(100 + rank)
        x.copy_(torch.randn_like(x))
        for i in range(len(archive)):
            archive[i].replay()
        torch.cuda.synchronize()
        result["digests"] = {archive[i].name: digest(archive.outputs(i)) for i in range(len(archive))}
        result["replay_ms"] = {archive[i].name: replay_ms(archive[i].replay) for i in range(len(archive))}
        result["exec_flags"] = archive[0].exec_flags()
        result["launches"] = {archive[i].name: kernel_launches(template_graph(archive, i)) for i in range(len(archive))}
        result["shapes"] = {archive[i].name: graph_shape(template_graph(archive, i)) for i in range(len(archive))}
        result["nccl_args"] = {archive[i].name: nccl_kernel_args(template_graph(archive, i)) for i in range(len(archive))}
    # One file per rank: the ranks share stdout, where their lines can interleave.
    (directory / f"result-{mode}-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    # Tearing the process group down while captured graphs still hold NCCL launches can block;
    # the program's work is done.
    os._exit(0)


if __name__ == "__main__":
    main()
