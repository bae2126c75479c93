"""Is a graph's instantiation cost the driver's own, or does Foundry's process make it dearer?

Captures one decode graph of the built-in model (8B shapes) with plain torch and instantiates its
CUgraph again and again (cuGraphInstantiateWithFlags): first destroying each exec at once, then
keeping every exec alive as a start does (timed per block of 32), then, with --reserve-gib, the
same after reserving that much virtual address space the way Foundry's allocation region does
(cuMemAddressReserve). Run it plain, then under Foundry's preload with its region set
(--region), and compare the milliseconds per instantiation: the same numbers mean the cost is
the driver's, whatever Foundry does.

Usage (a GPU machine):
  python scripts/instantiate_floor.py [--batch 64] [--count 256] [--reserve-gib 512]
                                     [--pregrow-batch 256 | --pregrow-noop 256]
  foundry run -- python scripts/instantiate_floor.py --region [--batch 64] [--count 256]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import torch

cuda = ctypes.CDLL("libcuda.so.1")
REGION_BASE, REGION_SIZE = 0x6000_0000_0000, 512 << 30  # foundry bench's region


def check(r: int, what: str) -> None:
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


def instantiate(graph: int) -> tuple[ctypes.c_void_p, float]:
    e = ctypes.c_void_p()
    t = time.perf_counter()
    check(cuda.cuGraphInstantiateWithFlags(ctypes.byref(e), ctypes.c_void_p(graph), ctypes.c_ulonglong(0)), "instantiate")
    return e, (time.perf_counter() - t) * 1e3


def destroyed_at_once_ms(graph: int, count: int) -> float:
    times = []
    for _ in range(count):
        e, ms = instantiate(graph)
        times.append(ms)
        check(cuda.cuGraphExecDestroy(e), "destroy")
    return round(statistics.median(times), 3)


def free_bytes() -> int:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return free.value


def kept_alive_ms(graph: int, count: int, out: dict, key: str) -> None:
    """Median ms per instantiation, per block of 32, every exec alive until the end; and the
    device memory the live execs hold, per exec."""
    free_before = free_bytes()
    live, blocks, block = [], [], []
    for i in range(count):
        e, ms = instantiate(graph)
        live.append(e)
        block.append(ms)
        if len(block) == 32 or i == count - 1:
            blocks.append(round(statistics.median(block), 3))
            block = []
    out[f"{key}_ms_per_32"] = blocks
    out[f"{key}_device_bytes_per_exec"] = (free_before - free_bytes()) // count
    for e in live:
        check(cuda.cuGraphExecDestroy(e), "destroy")


# A kernel that does nothing, with a parameter block the size of a typical decode kernel's.
NOOP_PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry foundry_noop(.param .align 8 .b8 p[%d]) { ret; }
"""


class KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS (v1, what cuGraphAddKernelNode takes)
    _fields_ = [("func", ctypes.c_void_p)] + [(n, ctypes.c_uint) for n in (
        "gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ", "sharedMemBytes")] + [
        ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)]


def noop_graph(nodes: int, param_bytes: int) -> int:
    """A chain of `nodes` kernel nodes of a no-op kernel: a graph that owes nothing to the model."""
    module, func, graph = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(NOOP_PTX % param_bytes)), "cuModuleLoadData")
    check(cuda.cuModuleGetFunction(ctypes.byref(func), module, b"foundry_noop"), "cuModuleGetFunction")
    check(cuda.cuGraphCreate(ctypes.byref(graph), ctypes.c_uint(0)), "cuGraphCreate")
    block = ctypes.create_string_buffer(param_bytes)
    args = (ctypes.c_void_p * 1)(ctypes.cast(block, ctypes.c_void_p))
    params = KernelNodeParams(func=func.value, gridDimX=1, gridDimY=1, gridDimZ=1, blockDimX=32, blockDimY=1,
                              blockDimZ=1, sharedMemBytes=0, kernelParams=ctypes.cast(args, ctypes.c_void_p).value)
    prev = ctypes.c_void_p()
    for i in range(nodes):
        node = ctypes.c_void_p()
        deps, ndeps = (ctypes.byref(prev), 1) if i else (None, 0)
        check(cuda.cuGraphAddKernelNode(ctypes.byref(node), graph, deps, ctypes.c_size_t(ndeps), ctypes.byref(params)),
              "cuGraphAddKernelNode")
        prev = node
    return graph.value


def reserve(gib: int) -> int:
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(gib << 30), ctypes.c_size_t(0),
                                   ctypes.c_uint64(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
    return ptr.value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--count", type=int, default=256)
    p.add_argument("--reserve-gib", type=int, default=0)
    p.add_argument("--region", action="store_true", help="set Foundry's allocation region first (needs the preload)")
    p.add_argument("--pregrow-batch", type=int, default=0,
                   help="first instantiate (and destroy) --count execs of this batch size's graph: does the "
                        "memory the driver keeps from another graph's execs make these instantiations cheap?")
    p.add_argument("--pregrow-noop", type=int, default=0, metavar="PARAM_BYTES",
                   help="first instantiate (and destroy) --count execs of a chain of no-op kernel nodes, as "
                        "many as the decode graph has, each with a parameter block of this size: can a "
                        "graph that owes nothing to the model grow the driver's memory ahead?")
    args = p.parse_args()
    torch.cuda.init()
    if args.region:
        import foundry_core as fdry

        fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    from foundry_core.model.config import SHAPES
    from foundry_core.model.decoder import DecodeRunner

    cfg = SHAPES["8b"]
    runner = DecodeRunner(type(cfg)(**{**cfg.as_dict(), "max_batch": args.batch}))
    runner.run(args.batch)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        runner.run(args.batch)
    torch.cuda.synchronize()
    graph = int(g.raw_cuda_graph())
    out: dict = {}
    if args.pregrow_batch:
        runner.run(args.pregrow_batch)
        other = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(other):
            runner.run(args.pregrow_batch)
        torch.cuda.synchronize()
        t = time.perf_counter()
        kept_alive_ms(int(other.raw_cuda_graph()), args.count, out, f"pregrow_bs{args.pregrow_batch}")
        out["pregrow_s"] = round(time.perf_counter() - t, 3)
    nodes = ctypes.c_size_t()
    check(cuda.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(nodes)), "cuGraphGetNodes")
    if args.pregrow_noop:
        t = time.perf_counter()
        kept_alive_ms(noop_graph(nodes.value, args.pregrow_noop), args.count, out, f"pregrow_noop{args.pregrow_noop}")
        out["pregrow_s"] = round(time.perf_counter() - t, 3)
    out.update({"batch": args.batch, "nodes": nodes.value, "region": args.region})
    kept_alive_ms(graph, args.count, out, "kept_alive")  # first: the driver's memory as left by the pregrow
    out["destroyed_at_once_ms"] = destroyed_at_once_ms(graph, 32)
    if args.reserve_gib:
        reserve(args.reserve_gib)
        out["reserved_gib"] = args.reserve_gib
        out["after_reserve_destroyed_at_once_ms"] = destroyed_at_once_ms(graph, 32)
        kept_alive_ms(graph, args.count, out, "after_reserve_kept_alive")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
