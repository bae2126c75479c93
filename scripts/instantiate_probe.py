"""Why a restored graph takes longer to instantiate than the captured one it came from.

Captures decode graphs of the built-in 8B model for a few batch sizes, saves them, restores them
in the same process, then instantiates (cuGraphInstantiateWithFlags, then destroys) each captured
CUgraph and each restored graph's template CUgraph (holding that graph's values) several times,
and compares: node and edge counts, kernel function handles node by node, nodes carrying
launch attributes, and the instantiation time of each, of a driver clone of each, and of the
captured graph after a round trip through cuGraphKernelNodeSetParams on every kernel node.
(What keeping every exec alive costs, in a process with or without Foundry: instantiate_floor.py.)

Usage: foundry run -- python scripts/instantiate_probe.py [SIZES...]   (a GPU machine)
"""

from __future__ import annotations

import ctypes
import json
import statistics
import sys
import tempfile
import time

import torch

import foundry_core as fdry
from foundry_core import _native
from foundry_core.model.config import SHAPES
from foundry_core.model.decoder import DecodeRunner

cuda = ctypes.CDLL("libcuda.so.1")
KERNEL = 0  # CU_GRAPH_NODE_TYPE_KERNEL
ATTRS = {"cooperative": 2, "cluster": 4, "cluster_policy": 5, "priority": 8, "sync_map": 9, "sync_domain": 10}


class KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


def check(r: int, what: str) -> None:
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


def nodes(g: int) -> list[int]:
    n = ctypes.c_size_t()
    check(cuda.cuGraphGetNodes(ctypes.c_void_p(g), None, ctypes.byref(n)), "cuGraphGetNodes")
    arr = (ctypes.c_void_p * n.value)()
    check(cuda.cuGraphGetNodes(ctypes.c_void_p(g), arr, ctypes.byref(n)), "cuGraphGetNodes")
    return list(arr)


def edges(g: int) -> int:
    n = ctypes.c_size_t()
    check(cuda.cuGraphGetEdges_v2(ctypes.c_void_p(g), None, None, None, ctypes.byref(n)), "cuGraphGetEdges")
    return n.value


def kernel_info(node: int) -> tuple[int, dict]:
    t = ctypes.c_int()
    cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
    if t.value != KERNEL:
        return 0, {}
    p = KernelParams()
    check(cuda.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)), "cuGraphKernelNodeGetParams")
    attrs = {}
    for name, aid in ATTRS.items():
        v = (ctypes.c_ubyte * 64)()
        if cuda.cuGraphKernelNodeGetAttribute(ctypes.c_void_p(node), aid, v) == 0 and any(v):
            attrs[name] = bytes(v[:16]).hex()
    return p.func or 0, attrs


def instantiate_s(g: int, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        e = ctypes.c_void_p()
        t = time.perf_counter()
        check(cuda.cuGraphInstantiateWithFlags(ctypes.byref(e), ctypes.c_void_p(g), ctypes.c_ulonglong(0)), "instantiate")
        times.append(time.perf_counter() - t)
        cuda.cuGraphExecDestroy(e)
    return statistics.median(times)


def clone(g: int) -> int:
    c = ctypes.c_void_p()
    check(cuda.cuGraphClone(ctypes.byref(c), ctypes.c_void_p(g)), "cuGraphClone")
    return c.value


def reset_kernel_params(g: int) -> None:
    """Gets and sets back every kernel node's parameters (what LOAD's delta writes do)."""
    for node in nodes(g):
        t = ctypes.c_int()
        cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
        if t.value == KERNEL:
            p = KernelParams()
            check(cuda.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)), "get")
            check(cuda.cuGraphKernelNodeSetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)), "set")


def describe(g: int) -> dict:
    ns = nodes(g)
    info = [kernel_info(n) for n in ns]
    return {"nodes": len(ns), "edges": edges(g), "kernels": sum(1 for f, _ in info if f),
            "with_attrs": sum(1 for _, a in info if a), "attr_kinds": sorted({k for _, a in info for k in a}),
            "funcs": [f for f, _ in info]}


def main() -> None:
    sizes = [int(s) for s in sys.argv[1:]] or [1, 64, 256]
    torch.cuda.init()
    fdry.set_allocation_region(0x6000_0000_0000, 256 << 30)
    cfg = SHAPES["8b"]
    runner = DecodeRunner(type(cfg)(**{**cfg.as_dict(), "max_batch": max(sizes)}))
    for b in sizes:
        runner.run(b)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    graphs, outputs = {}, {}
    for b in sorted(sizes, reverse=True):
        g = fdry.CUDAGraph()
        with fdry.graph(g, pool=pool):
            outputs[b] = list(runner.run(b))
        graphs[b] = g
    archive = tempfile.mkdtemp(prefix="probe-")
    fdry.save_graphs(archive, {f"bs{b}": (graphs[b], outputs[b]) for b in sizes})
    restored = fdry.load_graphs(archive, mode="lazy")
    for b in sizes:
        captured = int(graphs[b].raw_cuda_graph())
        r = restored.get(f"bs{b}")
        tmpl = ctypes.c_uint64()
        _native.call("foundry_graphset_template", restored._handle, r.index, ctypes.byref(tmpl))
        ours = tmpl.value
        dc, do = describe(captured), describe(ours)
        same_funcs = sum(1 for a, o in zip(dc.pop("funcs"), do.pop("funcs")) if a == o)
        row = {"batch": b, "captured": dc, "restored": do, "same_function_handles": same_funcs,
               "instantiate_s": {"captured": instantiate_s(captured), "restored": instantiate_s(ours),
                                 "captured_clone": instantiate_s(clone(captured)), "restored_clone": instantiate_s(clone(ours))}}
        c2 = clone(captured)
        reset_kernel_params(c2)
        row["instantiate_s"]["captured_after_set_params"] = instantiate_s(c2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
