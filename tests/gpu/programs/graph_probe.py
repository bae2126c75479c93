"""Graph SAVE (one process) and LOAD (a fresh process) for the GPU tests.

Usage: graph_probe.py save CASE DIR | load CASE DIR [MODE]
Both sides allocate the case's inputs in the same order right after setting the region; SAVE
then warms up and captures, LOAD restores. Both write fresh random inputs (seed 1234) into the
static input buffers, replay, and report a hash of every output byte.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import foundry_core as fdry
from foundry_core import _native
from _common import REGION_BASE, REGION_SIZE, emit, kernel_launches

HERE = Path(__file__).resolve().parent


def _digest(outputs) -> str:
    h = hashlib.sha256()
    for t in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _fresh(inputs):
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for t in inputs:
        if t.is_floating_point():
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda", dtype=t.dtype))


def pdl_library():
    so = Path(os.environ.get("FOUNDRY_TEST_TMP", "/tmp")) / "foundry_pdl_kernels.so"
    if not so.exists():
        subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-o", str(so),
                        str(HERE / "pdl_kernels.cu"), "-lcuda"], check=True)
    lib = ctypes.CDLL(str(so))
    lib.launch_pair.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
    lib.make_host_graph.restype = ctypes.c_void_p
    lib.make_child_graph.restype = ctypes.c_void_p
    lib.make_child_graph.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int]
    return lib


# ---- cases: inputs(), then step(inputs) -> outputs --------------------------------------------

def case_inputs(case: str):
    torch.manual_seed(0)
    if case == "elementwise":
        return [torch.randn(4096, 512, device="cuda")]
    if case in ("gemm_bf16", "gemm_fp16"):
        dt = torch.bfloat16 if case == "gemm_bf16" else torch.float16
        # A tall-skinny product with a long K makes cuBLAS pick split-K with a reduce kernel.
        return [torch.randn(64, 16384, device="cuda", dtype=dt), torch.randn(16384, 256, device="cuda", dtype=dt),
                torch.randn(2048, 4096, device="cuda", dtype=dt), torch.randn(4096, 4096, device="cuda", dtype=dt)]
    if case == "decode_linear":
        # vLLM's layout: F.linear with [out, in] weights (cuBLAS "TN"). The batch-8 gate_up
        # product's split-K kernel packs (8192, 24576) into one 8-byte parameter word, which
        # reads as 0x600000002000: a region address that nothing ever occupied.
        dt = torch.bfloat16
        return [torch.randn(8, 4096, device="cuda", dtype=dt), torch.randn(24576, 4096, device="cuda", dtype=dt),
                torch.randn(4096, 12288, device="cuda", dtype=dt)]
    if case in ("decode_gemm", "decode_gemm_paused"):
        # An 8B-class decoder layer's projections at decode batch 8 (cuBLAS picks in-kernel
        # split-K nvjet kernels); before the inputs, small blocks allocated and freed, and the
        # cache emptied, as an engine's start-up does.
        scratch = [torch.empty(n, device="cuda") for n in (1, 64, 4096)]
        del scratch
        torch.cuda.empty_cache()
        dt = torch.bfloat16
        return [torch.randn(8, 4096, device="cuda", dtype=dt), torch.randn(4096, 6144, device="cuda", dtype=dt),
                torch.randn(4096, 24576, device="cuda", dtype=dt), torch.randn(12288, 4096, device="cuda", dtype=dt)]
    if case == "compile":
        return [torch.randn(2048, 1024, device="cuda"), torch.randn(1024, device="cuda")]
    if case == "streams":
        return [torch.randn(2048, 2048, device="cuda")]
    if case == "pdl":
        return [torch.randn(1 << 20, device="cuda"), torch.empty(1 << 20, device="cuda")]
    if case == "foreign":
        return [torch.randn(1024, device="cuda")]
    raise SystemExit(f"unknown case {case}")


_compiled = None


def case_step(case: str, inputs):
    global _compiled
    if case == "elementwise":
        (x,) = inputs
        y = torch.relu(x * 2.0 + 1.0)
        return [y.sum(dim=-1), torch.softmax(y, dim=-1).amax(dim=0), torch.cumsum(x, dim=1)]
    if case in ("gemm_bf16", "gemm_fp16"):
        a, b, c, d = inputs
        return [a @ b, c @ d]
    if case == "decode_linear":
        x, w_gate_up, w_down = inputs
        gate, up = torch.nn.functional.linear(x, w_gate_up).chunk(2, dim=-1)
        return [torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w_down)]
    if case in ("decode_gemm", "decode_gemm_paused"):
        x, w_qkv, w_gate_up, w_down = inputs
        gate, up = (x @ w_gate_up).chunk(2, dim=-1)
        return [x @ w_qkv, (torch.nn.functional.silu(gate) * up) @ w_down]
    if case == "compile":
        if _compiled is None:
            _compiled = torch.compile(lambda x, w: torch.nn.functional.gelu(x * w + 1.0).sum(dim=-1), dynamic=False)
        return [_compiled(*inputs)]
    if case == "streams":
        (x,) = inputs
        side = torch.cuda.Stream(priority=-1)  # its kernel nodes carry another priority than main's
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            a = torch.tanh(x) @ x
        b = torch.sigmoid(x).sum(dim=0)
        main.wait_stream(side)
        return [a + b, b]
    if case == "pdl":
        x, mid = inputs
        out = torch.empty_like(x)
        rc = pdl_library().launch_pair(torch.cuda.current_stream().cuda_stream, x.data_ptr(), mid.data_ptr(),
                                       out.data_ptr(), x.numel())
        assert rc == 0, f"cudaLaunchKernelEx failed: {rc}"
        return [out]
    if case == "foreign":
        return [inputs[0] + _foreign]
    raise SystemExit(case)


_foreign = None


def edges(handle: int) -> list[list[int]]:
    """[from, to, type, from_port, to_port] of every edge, sorted."""
    n = ctypes.c_uint64()
    _native.call("foundry_graph_edges", handle, None, 0, ctypes.byref(n))
    arr = (ctypes.c_uint32 * max(2 * n.value, 1))()
    _native.call("foundry_graph_edges", handle, arr, n.value, ctypes.byref(n))
    out = []
    for i in range(n.value):
        ends, data = arr[2 * i], arr[2 * i + 1]
        out.append([ends >> 16, ends & 0xFFFF, data & 0xFF, (data >> 8) & 0xFF, (data >> 16) & 0xFF])
    return sorted(out)


def save(case: str, directory: str) -> dict:
    global _foreign
    torch.cuda.init()
    if case == "foreign":
        _foreign = torch.randn(1024, device="cuda")  # allocated before the region: its address is not reproducible
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    inputs = case_inputs(case)
    if case == "decode_gemm_paused":
        paused_first_use(case, inputs)
    for _ in range(3):
        case_step(case, inputs)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # engines empty the cache between warmup and capture
    g = fdry.CUDAGraph()
    start = time.perf_counter()
    with fdry.graph(g):
        outputs = case_step(case, inputs)
    capture_s = time.perf_counter() - start
    g.replay()
    result = {"capture_s": capture_s, "edges": edges(g.raw_cuda_graph()), "exec_flags": torch_exec_flags(g),
              "launches": kernel_launches(g.raw_cuda_graph())}
    try:
        g.save(Path(directory) / "graph.json", output_tensors=outputs)
    except fdry.FoundryError as exc:
        return {**result, "error": type(exc).__name__, "message": str(exc)}
    _fresh(inputs)
    g.replay()
    torch.cuda.synchronize()
    names = []
    for f in _kernel_functions(g.raw_cuda_graph()):
        names.append(fdry.images.function_image(f)[1])
    return {**result, "digest": _digest(outputs), "kernels": names}


def torch_exec_flags(g) -> int | None:
    """The flags PyTorch instantiated its captured graph with (None on a torch without
    raw_cuda_graph_exec)."""
    raw = getattr(g, "raw_cuda_graph_exec", None)
    if raw is None:
        return None
    cuda = ctypes.CDLL("libcuda.so.1")
    flags = ctypes.c_uint64()
    assert cuda.cuGraphExecGetFlags(ctypes.c_void_p(raw()), ctypes.byref(flags)) == 0
    return flags.value


def paused_first_use(case: str, inputs) -> None:
    """What an engine plugin's SAVE does for work LOAD skips (memory profiling): the region
    stopped and PyTorch allocating into a private pool; here the process's first GEMMs (cuBLAS
    handle and workspaces) happen inside such a pause."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    fdry.stop_allocation_region()
    try:
        with torch.cuda.use_mem_pool(torch.cuda.MemPool()):
            case_step(case, inputs)
            torch.cuda.synchronize()
    finally:
        torch.cuda.empty_cache()
        fdry.resume_allocation_region()


def _kernel_functions(handle: int) -> list[int]:
    n = ctypes.c_uint64()
    _native.call("foundry_graph_kernel_functions", handle, None, 0, ctypes.byref(n))
    arr = (ctypes.c_uint64 * max(n.value, 1))()
    _native.call("foundry_graph_kernel_functions", handle, arr, n.value, ctypes.byref(n))
    return list(arr[: n.value])


def load(case: str, directory: str) -> dict:
    torch.cuda.init()
    fdry.load_cuda_modules_and_libraries(directory)
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    inputs = case_inputs(case)
    start = time.perf_counter()
    g, outputs = fdry.CUDAGraph.load(Path(directory) / "graph.json")
    load_s = time.perf_counter() - start
    _fresh(inputs)
    g.replay()
    torch.cuda.synchronize()
    tmpl = ctypes.c_uint64()
    _native.call("foundry_graphset_template", g._archive._handle, 0, ctypes.byref(tmpl))
    return {"digest": _digest(outputs), "load_s": load_s, "edges": edges(tmpl.value), "exec_flags": g.exec_flags(),
            "launches": kernel_launches(tmpl.value)}


def host_node(directory: str) -> dict:
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    handle = pdl_library().make_host_graph()
    try:
        fdry.save_graphs(Path(directory) / "host", {"host": (int(handle), None)})
    except fdry.FoundryError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def child_graph(mode: str, directory: str) -> dict:
    """A raw CUgraph with a child-graph node, built by the driver API, saved and restored."""
    torch.cuda.init()
    if mode == "load":
        fdry.load_cuda_modules_and_libraries(Path(directory) / "child")
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    torch.manual_seed(0)
    x = torch.randn(1 << 16, device="cuda")
    mid, out = torch.empty_like(x), torch.empty_like(x)
    if mode == "save":
        handle = pdl_library().make_child_graph(x.data_ptr(), mid.data_ptr(), out.data_ptr(), x.numel())
        assert handle, "building the child graph failed"
        fdry.save_graphs(Path(directory) / "child", {"child": (int(handle), out)})
        return {"saved": True}
    archive = fdry.load_graphs(Path(directory) / "child")
    _fresh([x])
    archive[0].replay()
    torch.cuda.synchronize()
    expected = (x * 3 + 1) * 0.5 - 2
    restored = archive.outputs(0)
    return {"max_error": float((restored - expected).abs().max()), "same_memory": restored.data_ptr() == out.data_ptr(),
            "same_object": archive.outputs(0) is restored}  # made once, at the first ask


def many(mode: str, directory: str) -> dict:
    """The single-graph flow for several graphs: save each, regroup with save_graph_manifest, and
    restore with start_graph_builds / finish_one_graph_load / finish_graph_loads."""
    torch.cuda.init()
    if mode == "load":
        fdry.load_cuda_modules_and_libraries(directory)
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    torch.manual_seed(0)
    w = torch.randn(1024, 1024, device="cuda")
    x = torch.randn(64, 1024, device="cuda")
    sizes = [64, 48, 32, 16, 8, 4, 2, 1]
    paths = [Path(directory) / f"graph_{b}.json" for b in sizes]
    if mode == "save":
        def step(b):
            return torch.relu(x[:b] @ w).sum(dim=-1)
        for b in sizes:
            step(b)
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        graphs, outs = [], []
        for b, path in zip(sizes, paths):
            g = fdry.CUDAGraph()
            with fdry.graph(g, pool=pool):
                o = step(b)
            g.save(path, output_tensors=o)
            graphs.append(g)
            outs.append(o)
        merged = fdry.save_graph_manifest(directory)
        _fresh([x])
        for g in graphs:
            g.replay()
        torch.cuda.synchronize()
        return {"digests": [_digest(o) for o in outs], "groups": read_groups(merged)}
    pending = fdry.CUDAGraph.start_graph_builds(paths, num_threads=4)
    first, _ = fdry.CUDAGraph.finish_one_graph_load(pending, 0)
    restored = fdry.CUDAGraph.finish_graph_loads(pending)
    _fresh([x])
    for g, _ in restored:
        g.replay()
    torch.cuda.synchronize()
    return {"digests": [_digest(o) for _, o in restored], "first_is_bs64": first.name == "graph_64"}


def read_groups(path) -> int:
    import json

    return json.loads(Path(path).read_text())["groups"]


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "save":
        emit(save(sys.argv[2], sys.argv[3]))
    elif mode == "load":
        emit(load(sys.argv[2], sys.argv[3]))
    elif mode == "host":
        emit(host_node(sys.argv[2]))
    elif mode == "child":
        emit(child_graph(sys.argv[2], sys.argv[3]))
    elif mode == "many":
        emit(many(sys.argv[2], sys.argv[3]))
