"""A kernel's cache preference (cuFuncSetCacheConfig) through SAVE and a fresh process's LOAD.

Usage: cache_config_probe.py save DIR | load DIR KERNELS_JSON (the "kernels" SAVE reported)
The graph runs a Triton matmul whose tiles need more than 48 KiB of shared memory (Triton then
sets CU_FUNC_CACHE_PREFER_SHARED on it when it loads the kernel), a small Triton kernel the program
sets to CU_FUNC_CACHE_PREFER_L1 itself through libcuda with ctypes, and an ATen kernel that keeps
the default. The driver cannot report a function's preference, so what is compared is what
Foundry saw and did: at SAVE the preferences the preload recorded and those the archive holds; at
LOAD the preference Foundry set on the very CUfunction the restored graph runs (the archive's own
copy of each kernel: LOAD never lets Triton load them). Both sides also digest the outputs.
"""

# No `from __future__ import annotations`: Triton reads the kernels' tl.constexpr annotations.
import ctypes
import sys
from pathlib import Path

import torch

import foundry_core as fdry
from foundry_core import _native
from foundry_core.images import function_cache_config, function_image, resolve_function
from foundry_core.inspect import payload_dump
from _common import REGION_BASE, REGION_SIZE, emit
from graph_probe import _digest, _fresh, _kernel_functions

PREFER_L1 = 2  # CU_FUNC_CACHE_PREFER_L1
# Triton 3.9 first asks for this attribute (17 = CU_FUNC_ATTRIBUTE_SHARED_MEMORY_MODE, value 3:
# oversized shared memory) and sets no cache preference when the driver accepts it; CUDA 13.0's
# driver does not know the attribute, so Triton falls back to cuFuncSetCacheConfig.
SHARED_MEMORY_MODE, OVERSIZED = 17, 3
M = N = K = 512
# fp16 A and B tiles of 128x128: 64 KiB of shared memory even where Triton does not multi-buffer
# the loop (Triton 3.9 compiles this to 65536 bytes for sm_80 and sm_90), 128 KiB where it does.
BLOCK_M, BLOCK_N, BLOCK_K, STAGES = 128, 128, 128, 2


def inputs():
    torch.manual_seed(0)
    return [torch.randn(M, K, device="cuda", dtype=torch.float16), torch.randn(K, N, device="cuda", dtype=torch.float16),
            torch.randn(1 << 16, device="cuda")]


try:
    import triton
    import triton.language as tl
except ImportError as exc:  # save() reports it and the test skips
    triton, TRITON_MISSING = None, str(exc)

if triton is not None:  # module level: Triton resolves the names a kernel uses in its globals

    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, K, stride_am, stride_bk, stride_cm,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K, BLOCK_K):
            acc += tl.dot(tl.load(a_ptrs), tl.load(b_ptrs))
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * stride_bk
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(tl.float16))

    @triton.jit
    def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


def step(ts):
    a, b, x = ts
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    matmul_kernel[(M // BLOCK_M, N // BLOCK_N)](a, b, c, K, a.stride(0), b.stride(0), c.stride(0), BLOCK_M=BLOCK_M,
                                                BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=8, num_stages=STAGES)
    y = torch.empty_like(x)
    scale_kernel[(x.numel() // 1024,)](x, y, x.numel(), BLOCK=1024)
    return [c, y, y + 1.0]  # the last one: an ATen kernel, left with the default preference


def save(directory: str) -> dict:
    if triton is None:
        return {"skip": f"Triton is not installed ({TRITON_MISSING})"}
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    ts = inputs()
    for _ in range(3):  # compiles, and Triton loads each kernel (setting PREFER_SHARED on the matmul)
        step(ts)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    g = fdry.CUDAGraph()
    with fdry.graph(g):
        outputs = step(ts)
    g.replay()
    functions = {}
    for f in _kernel_functions(g.raw_cuda_graph()):
        h, name = function_image(f)
        functions[name] = (f, h)
    # Through libcuda's own symbol, as any application would: the preload must see this call too.
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuFuncSetCacheConfig.argtypes = [ctypes.c_void_p, ctypes.c_int]
    rc = cuda.cuFuncSetCacheConfig(ctypes.c_void_p(functions["scale_kernel"][0]), PREFER_L1)
    assert rc == 0, f"cuFuncSetCacheConfig failed: {rc}"
    mode = ctypes.c_int(0)
    cuda.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p]
    oversized = (cuda.cuFuncGetAttribute(ctypes.byref(mode), SHARED_MEMORY_MODE,
                                         ctypes.c_void_p(functions["matmul_kernel"][0])) == 0 and mode.value == OVERSIZED)
    g.save(Path(directory) / "graph.json", output_tensors=outputs)
    # What the archive holds per kernel: its preference, and the dynamic shared memory its node
    # launches with (Triton's own figure for the kernel).
    archived, shared = {}, {}
    for t in payload_dump(Path(directory) / "graph.fgr")["templates"]:
        for n in t["nodes"]:
            if n["kind"] == "kernel":
                archived[n["kernel"]["name"]] = n["kernel"]["func"]["cache_config"]
                shared[n["kernel"]["name"]] = n["kernel"]["shared_mem"]
    _fresh(ts)
    g.replay()
    torch.cuda.synchronize()
    return {
        "digest": _digest(outputs),
        "triton": triton.__version__,
        "oversized_shared_mode": oversized,
        "kernels": [{"name": name, "hash": h, "seen": function_cache_config(f), "archived": archived.get(name),
                     "shared": shared.get(name)} for name, (f, h) in sorted(functions.items())],
    }


def load(directory: str, saved_kernels: list[dict]) -> dict:
    torch.cuda.init()
    fdry.load_cuda_modules_and_libraries(directory)
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    ts = inputs()
    g, outputs = fdry.CUDAGraph.load(Path(directory) / "graph.json")
    _fresh(ts)
    g.replay()
    torch.cuda.synchronize()
    tmpl = ctypes.c_uint64()
    _native.call("foundry_graphset_template", g._archive._handle, 0, ctypes.byref(tmpl))
    in_graph = set(_kernel_functions(tmpl.value))
    restored = {}
    for k in saved_kernels:
        # The registry's handle for the archived kernel: the one the restored graph was built with.
        f = resolve_function(k["hash"], k["name"])
        restored[k["name"]] = {"in_graph": f in in_graph, "config": function_cache_config(f)}
    return {"digest": _digest(outputs), "kernels": restored}


if __name__ == "__main__":
    if sys.argv[1] == "save":
        emit(save(sys.argv[2]))
    else:
        import json

        emit(load(sys.argv[2], json.loads(Path(sys.argv[3]).read_text())))
