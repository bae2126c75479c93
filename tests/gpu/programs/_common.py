"""Helpers shared by the GPU test programs (each runs in its own fresh process)."""

from __future__ import annotations

import ctypes
import json
import sys
from collections.abc import Iterator

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


def _nodes(cuda: ctypes.CDLL, graph: int) -> list[int]:
    """The nodes of the CUgraph ``graph``."""
    n = ctypes.c_size_t()
    assert cuda.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)) == 0
    nodes = (ctypes.c_void_p * max(n.value, 1))()
    assert cuda.cuGraphGetNodes(ctypes.c_void_p(graph), nodes, ctypes.byref(n)) == 0
    return list(nodes[: n.value])


def _kernel_nodes(cuda: ctypes.CDLL, graph: int) -> Iterator[tuple[int, _KernelNodeParams, str]]:
    """(node, its launch parameters, its function's name) for each kernel node of ``graph``."""
    for node in _nodes(cuda, graph):
        kind = ctypes.c_int()
        if cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) != 0 or kind.value != 0:
            continue
        p = _KernelNodeParams()
        assert cuda.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)) == 0
        name = ctypes.c_char_p()
        assert cuda.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(p.func)) == 0
        yield node, p, name.value.decode()


def kernel_launches(graph: int, contains: str = "") -> list[dict]:
    """Each kernel node of the CUgraph ``graph`` whose function name contains ``contains``: name,
    grid, block, dynamic shared memory, priority and cluster shape, read from the driver (to
    compare a captured graph's launches with a restored one's)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    out = []
    for node, p, text in _kernel_nodes(cuda, graph):
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


_NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "child", 5: "empty", 6: "event_wait",
               7: "event_record", 8: "semaphore_signal", 9: "semaphore_wait", 10: "mem_alloc", 11: "mem_free",
               12: "batch_mem_op", 13: "conditional"}


def _node_type(cuda: ctypes.CDLL, node: int) -> int:
    kind = ctypes.c_int()
    assert cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) == 0
    return kind.value


def graph_shape(graph: int) -> dict:
    """The CUgraph ``graph``'s node count per node type and its edge count, read from the driver."""
    cuda = ctypes.CDLL("libcuda.so.1")
    counts: dict[str, int] = {}
    for node in _nodes(cuda, graph):
        kind = _node_type(cuda, node)
        name = _NODE_TYPES.get(kind, str(kind))
        counts[name] = counts.get(name, 0) + 1
    edges = ctypes.c_size_t()
    assert cuda.cuGraphGetEdges(ctypes.c_void_p(graph), None, None, ctypes.byref(edges)) == 0
    return {"nodes": counts, "edges": edges.value}


def _argument_buffer(p: _KernelNodeParams) -> int | None:
    """The packed argument buffer a node's ``extra`` names (CU_LAUNCH_PARAM_BUFFER_POINTER)."""
    if not p.extra:
        return None
    extra = ctypes.cast(p.extra, ctypes.POINTER(ctypes.c_void_p))
    for i in range(0, 16, 2):
        key = extra[i] or 0
        if key == 0:  # CU_LAUNCH_PARAM_END
            return None
        if key == 1:  # CU_LAUNCH_PARAM_BUFFER_POINTER
            return extra[i + 1]
    return None


def nccl_kernel_args(graph: int) -> list[dict]:
    """The argument block of each NCCL kernel node of ``graph`` (NCCL passes one struct by value:
    its communicator's device pointer, channel mask, where the work lies, work mask, work buffer),
    decoded from the driver's copy of the node's parameters, with its size."""
    cuda = ctypes.CDLL("libcuda.so.1")
    out = []
    for _node, p, name in _kernel_nodes(cuda, graph):
        if "nccl" not in name.lower():
            continue
        offset, size = ctypes.c_size_t(), ctypes.c_size_t()
        if cuda.cuFuncGetParamInfo(ctypes.c_void_p(p.func), 0, ctypes.byref(offset), ctypes.byref(size)) != 0:
            out.append({"params": "unreadable (cuFuncGetParamInfo)"})
            continue
        arg0 = _argument_buffer(p) if not p.params else ctypes.cast(p.params, ctypes.POINTER(ctypes.c_void_p))[0]
        if not arg0:
            out.append({"params": "unreadable", "size": size.value})
            continue
        raw = ctypes.string_at(arg0, min(size.value, 64))
        comm, mask, storage, work_mask, work_buf = (int.from_bytes(raw[0:8], "little"), int.from_bytes(raw[8:16], "little"),
                                                    int.from_bytes(raw[16:20], "little"), int.from_bytes(raw[20:24], "little"),
                                                    int.from_bytes(raw[24:32], "little"))
        out.append({"size": size.value, "comm": hex(comm), "channel_mask": hex(mask), "work_storage": storage,
                    "work_mask": hex(work_mask), "work_buf": hex(work_buf), "next32": raw[32:64].hex()})
    return out


def template_graph(archive, i: int) -> int:
    """The CUgraph restored graph ``i`` of ``archive`` was instantiated from (its values written in)."""
    from foundry_core import _native

    out = ctypes.c_uint64()
    _native.call("foundry_graphset_template", archive._handle, i, ctypes.byref(out))
    return out.value


_EDGE_ENDS = {0: "kernel", 6: "wait", 7: "record"}


def edge_kinds(graph: int) -> dict[str, int]:
    """The CUgraph ``graph``'s edges counted by the types of their two ends, their dependency type
    (0 full, 1 programmatic) and their outgoing port, read from the driver."""
    cuda = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_size_t()
    assert cuda.cuGraphGetEdges_v2(ctypes.c_void_p(graph), None, None, None, ctypes.byref(n)) == 0
    src, dst = (ctypes.c_void_p * max(n.value, 1))(), (ctypes.c_void_p * max(n.value, 1))()
    data = (ctypes.c_uint8 * (8 * max(n.value, 1)))()  # CUgraphEdgeData: from_port, to_port, type, reserved[5]
    assert cuda.cuGraphGetEdges_v2(ctypes.c_void_p(graph), src, dst, data, ctypes.byref(n)) == 0

    def end(node) -> str:
        kind = _node_type(cuda, node)
        return _EDGE_ENDS.get(kind, _NODE_TYPES.get(kind, str(kind)))

    counts: dict[str, int] = {}
    for i in range(n.value):
        key = f"{end(src[i])}->{end(dst[i])} type{data[8 * i + 2]} port{data[8 * i]}"
        counts[key] = counts.get(key, 0) + 1
    return counts
