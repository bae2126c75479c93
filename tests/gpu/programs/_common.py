"""Helpers shared by the GPU test programs (each runs in its own fresh process)."""

from __future__ import annotations

import ctypes
import json
import sys

REGION_BASE = 0x6000_0000_0000
REGION_SIZE = 256 << 30


def emit(result: dict) -> None:
    """Prints the program's result as one JSON line (the test reads the last one)."""
    print(json.dumps(result), flush=True)
    sys.stdout.flush()


def log_to_json(entries) -> list[dict]:
    return [{"seq": e.seq, "kind": e.kind, "offset": e.offset, "size": e.size, "tag": e.tag} for e in entries]


def log_from_json(items) -> list:
    from foundry_core.region import LogEntry

    return [LogEntry(i["seq"], i["kind"], i["offset"], i["size"], i.get("tag", "")) for i in items]


class _KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h)
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


_PRIORITY = 8  # CU_LAUNCH_ATTRIBUTE_PRIORITY
_CLUSTER = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


def kernel_launches(graph: int, contains: str = "") -> list[dict]:
    """Each kernel node of the CUgraph ``graph`` whose function name contains ``contains``: name,
    grid, block, dynamic shared memory, priority and cluster shape, read from the driver (to
    compare a captured graph's launches with a restored one's)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_size_t()
    assert cuda.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)) == 0
    nodes = (ctypes.c_void_p * max(n.value, 1))()
    assert cuda.cuGraphGetNodes(ctypes.c_void_p(graph), nodes, ctypes.byref(n)) == 0
    out = []
    for node in nodes[: n.value]:
        kind = ctypes.c_int()
        if cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) != 0 or kind.value != 0:
            continue
        p = _KernelNodeParams()
        assert cuda.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)) == 0
        name = ctypes.c_char_p()
        assert cuda.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(p.func)) == 0
        text = name.value.decode()
        if contains not in text:
            continue
        value = (ctypes.c_int * 16)()  # CUlaunchAttributeValue: a 64-byte union
        assert cuda.cuGraphKernelNodeGetAttribute(ctypes.c_void_p(node), _PRIORITY, value) == 0
        priority = value[0]
        value = (ctypes.c_uint * 16)()
        assert cuda.cuGraphKernelNodeGetAttribute(ctypes.c_void_p(node), _CLUSTER, value) == 0
        out.append({"name": text, "grid": list(p.grid), "block": list(p.block), "shared": p.shared,
                    "priority": priority, "cluster": list(value[:3])})
    return out
