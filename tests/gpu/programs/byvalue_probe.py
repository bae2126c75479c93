"""Graphs whose kernels take by-value parameter structs with unused slots: SAVE in one process,
LOAD in a fresh one.

Usage: byvalue_probe.py save CASE DIR | load CASE DIR

ATen's cat, stack and foreach kernels (multi_tensor_apply) take a metadata struct with a fixed
number of slots and write only the used ones: the rest holds whatever the host stack held, often
the address of a tensor freed since. Cases:

- ``block``: a GPT-style decode block (fp16) at batch sizes 8, 4, 2, 1, its KV cache grown with
  ``torch.cat``, ``torch.stack`` of its outputs and foreach ops over lists of tensors. Before the
  capture, the same ops run on views into large temporaries that are then freed, so stale slots
  can point into freed region memory. Saved with ``fdry.save_graphs``.
- ``block-single``: the same graphs saved one by one with ``CUDAGraph.save``.
- ``planted``: an int64 add whose by-value scalar is, on purpose, the address of a freed region
  temporary: a stale word that exists whatever the host stack holds.

SAVE reports every parameter word it finds pointing into freed region memory (read from the
driver's copy of each kernel node, judged against the allocation log) and the foundry log lines
written while saving. Both sides write the same fresh inputs into the static buffers, replay and
hash every output byte.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
import tempfile
from pathlib import Path

import torch

import foundry_core as fdry
from _common import REGION_BASE, REGION_SIZE, _kernel_nodes, emit

SIZES = [8, 4, 2, 1]  # largest first, as engines capture
D, H, HD, T = 512, 8, 64, 256  # model width, heads, head size, cached tokens
TEMP_BYTES = 64 << 20  # each large temporary freed before the capture


# ---- the decode block --------------------------------------------------------------------------


def block_state() -> dict:
    """Weights, KV cache, inputs and accumulators, allocated right after the region is set."""
    torch.manual_seed(0)
    dt = torch.float16
    b = max(SIZES)
    return {"w_qkv": torch.randn(D, 3 * D, device="cuda", dtype=dt) * D ** -0.5,
            "w_o": torch.randn(D, D, device="cuda", dtype=dt) * D ** -0.5,
            "x": torch.randn(b, D, device="cuda", dtype=dt),
            "past_k": torch.randn(b, H, T, HD, device="cuda", dtype=dt),
            "past_v": torch.randn(b, H, T, HD, device="cuda", dtype=dt),
            "acc": [torch.zeros(b, D, device="cuda", dtype=dt) for _ in range(3)]}


def block(s: dict, b: int) -> list[torch.Tensor]:
    x = s["x"][:b]
    q, k, v = (x @ s["w_qkv"]).view(b, 3, H, HD).unbind(1)
    # The step's K/V joined to the past ones: what a cache grown with torch.cat does each step.
    k_all = torch.cat([s["past_k"][:b], k.unsqueeze(2).contiguous()], dim=2)
    v_all = torch.cat([s["past_v"][:b], v.unsqueeze(2).contiguous()], dim=2)
    scores = torch.matmul(q.unsqueeze(2), k_all.transpose(-1, -2)) * HD ** -0.5
    attn = torch.matmul(torch.softmax(scores.float(), dim=-1).to(x.dtype), v_all)
    h = attn.reshape(b, D) @ s["w_o"]
    parts = [h, x, h * x]
    present = torch.stack([k_all, v_all])
    mixed = torch.stack(parts, dim=1)
    acc = [a[:b] for a in s["acc"]]
    torch._foreach_add_(acc, torch._foreach_mul(parts, 0.5))
    return [h, present, mixed, *acc]


def prime_host_stack() -> list[tuple[int, int]]:
    """Runs cat, stack and foreach over many views into large temporaries, then frees them: the
    host stack the captured launches build their structs on then holds addresses of freed region
    memory. Returns the temporaries' (address, size)."""
    temps = [torch.empty(TEMP_BYTES // 2, device="cuda", dtype=torch.float16) for _ in range(4)]
    views = [t[i * (1 << 20): i * (1 << 20) + 4096] for t in temps for i in range(30)]
    torch.cat(views)
    torch.stack(views[:64])
    torch._foreach_add_(torch._foreach_mul(views, 0.5), views)
    torch.cuda.synchronize()
    spans = [(t.data_ptr(), TEMP_BYTES) for t in temps]
    del temps, views
    torch.cuda.empty_cache()  # back to the region: the memory is freed, the addresses stay on the stack
    return spans


# ---- the planted word --------------------------------------------------------------------------


def planted_state() -> dict:
    return {"x": torch.arange(1 << 16, device="cuda", dtype=torch.int64)}


def planted_address() -> int:
    """An address deep inside a freed 256 MiB region temporary (the capture's own small
    allocations reuse the start of that hole, not this far into it)."""
    temp = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    addr = temp.data_ptr() + (200 << 20)
    del temp
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return addr


def planted(s: dict, addr: int) -> list[torch.Tensor]:
    return [s["x"] + addr, s["x"] * 3]  # the scalar travels by value inside the kernel's functor


# ---- common ------------------------------------------------------------------------------------


def fresh(s: dict, seed: int = 1234) -> None:
    """Seeded values in every static buffer (the foreach ops accumulate into ``acc``)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for t in (v for value in s.values() for v in (value if isinstance(value, list) else [value])):
        if t.is_floating_point():
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda", dtype=t.dtype))
        else:
            t.copy_(torch.randint(0, 1 << 40, t.shape, generator=gen, device="cuda", dtype=t.dtype))


def digest(outputs) -> str:
    h = hashlib.sha256()
    for t in outputs:
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def replay_all(graphs: dict) -> dict[str, str]:
    """Replays each ``(graph, outputs)`` in order and hashes its outputs right after its replay
    (the foreach ops accumulate, so the order is part of the result)."""
    digests = {}
    for name, (g, outputs) in graphs.items():
        g.replay()
        torch.cuda.synchronize()
        digests[name] = digest(outputs)
    return digests


def freed_param_words(graph: int) -> list[dict]:
    """Every 8-byte-aligned kernel parameter word of the CUgraph ``graph`` that points into region
    memory that was allocated once and is not live now (judged against the allocation log), with
    its kernel and parameter offset. SAVE's audit reads the same words."""
    live, ever = {}, []
    for e in fdry.allocation_log():
        if e.kind in ("alloc", "reserve"):
            live[e.offset] = e.size
            ever.append((e.offset, e.size))
        elif e.kind in ("free", "unreserve"):
            live.pop(e.offset, None)

    def freed(word: int) -> bool:
        off = word - REGION_BASE
        if not 0 <= off < REGION_SIZE or word < (1 << 32):
            return False
        inside = lambda spans: any(o <= off < o + n for o, n in spans)  # noqa: E731
        return not inside(live.items()) and inside(ever)

    cuda = ctypes.CDLL("libcuda.so.1")
    found = []
    for _node, p, name in _kernel_nodes(cuda, graph):
        args = ctypes.cast(p.params, ctypes.POINTER(ctypes.c_void_p)) if p.params else None
        for i in range(1024):
            offset, size = ctypes.c_size_t(), ctypes.c_size_t()
            if cuda.cuFuncGetParamInfo(ctypes.c_void_p(p.func), i, ctypes.byref(offset), ctypes.byref(size)) != 0:
                break
            if args is None:  # launched through `extra`: none of ATen's kernels are
                continue
            raw = ctypes.string_at(args[i], size.value)
            first = (offset.value + 7) // 8 * 8
            for o in range(first, offset.value + size.value - 7, 8):
                word = int.from_bytes(raw[o - offset.value: o - offset.value + 8], "little")
                if freed(word):
                    found.append({"kernel": name, "offset": o, "word": hex(word)})
    return found


@contextlib.contextmanager
def stderr_lines(into: list[str]):
    """Collects what is written to file descriptor 2 (the native log) inside the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            text = f.read()
            sys.stderr.write(text)
            into.extend(line for line in text.splitlines() if line.startswith("[foundry"))


def names(case: str) -> list[str]:
    return ["planted"] if case == "planted" else [f"bs{b}" for b in SIZES]


def save(case: str, directory: str) -> dict:
    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    s = planted_state() if case == "planted" else block_state()
    steps = {"planted": lambda addr: planted(s, addr)} if case == "planted" else {
        f"bs{b}": (lambda b: lambda _addr: block(s, b))(b) for b in SIZES}
    for step in steps.values():  # warm up: cuBLAS handles, workspaces, lazy kernel loads
        step(7)
    torch.cuda.synchronize()
    addr, temps = 0, []
    if case == "planted":
        addr = planted_address()
    else:
        temps = prime_host_stack()
    pool = torch.cuda.graph_pool_handle()
    graphs, outputs = {}, {}
    for name, step in steps.items():
        g = fdry.CUDAGraph()
        with fdry.graph(g, pool=pool):
            outputs[name] = step(addr)
        graphs[name] = g
    torch.cuda.synchronize()
    stale = {name: freed_param_words(g.raw_cuda_graph()) for name, g in graphs.items()}
    cuda = ctypes.CDLL("libcuda.so.1")
    kernels = sorted({k for g in graphs.values() for _n, _p, k in _kernel_nodes(cuda, g.raw_cuda_graph())})
    result = {"stale": stale, "kernels": kernels, "planted": hex(addr), "temporaries": [hex(a) for a, _ in temps]}
    log: list[str] = []
    try:
        with stderr_lines(log):
            if case == "block-single":
                for name, g in graphs.items():
                    g.save(Path(directory) / f"{name}.json", output_tensors=outputs[name])
            else:
                fdry.save_graphs(directory, {name: (g, outputs[name]) for name, g in graphs.items()})
    except fdry.FoundryError as exc:
        return {**result, "log": log, "error": type(exc).__name__, "message": str(exc)}
    fresh(s)
    digests = replay_all({name: (g, outputs[name]) for name, g in graphs.items()})
    return {**result, "log": log, "digests": digests,
            "planted_kept": case != "planted" or bool((outputs["planted"][0] - s["x"] == addr).all())}


def load(case: str, directory: str) -> dict:
    torch.cuda.init()
    fdry.load_cuda_modules_and_libraries(directory)
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    s = planted_state() if case == "planted" else block_state()
    if case == "block-single":
        restored = {name: fdry.CUDAGraph.load(Path(directory) / f"{name}.json") for name in names(case)}
    else:
        archive = fdry.load_graphs(directory)
        restored = {name: (archive.get(name), archive.outputs(archive.get(name).index)) for name in names(case)}
    fresh(s)
    result = {"digests": replay_all(restored)}
    if case == "planted":
        result["difference"] = sorted({int(v) for v in (restored["planted"][1][0] - s["x"]).unique().tolist()})
    return result


if __name__ == "__main__":
    mode, case, directory = sys.argv[1:4]
    if case not in ("block", "block-single", "planted"):
        raise SystemExit(f"unknown case {case}")
    emit(save(case, directory) if mode == "save" else load(case, directory))
