"""Whether restored tensor-parallel graphs replay faster than captured ones, and why.

vLLM's decode step after LOAD with tensor parallel 2 runs 1.2-3 % shorter than with the graphs
it captured itself, where one GPU shows no difference. This probe separates the graphs from the
process: a stack of decoder-like layers at 8B shapes (36 layers, two all-reduces each, through
torch.distributed's NCCL), graphs for batch 1, 8, 32 and 128 on each of two ranks.

- save: captures, saves, and times the captured graphs.
- load: restores, times the restored graphs, then captures the same layers again in the same
  process and times restored and recaptured graphs in alternation, so both see the same NCCL
  communicator, clocks and heap.

Both check every graph's outputs against the eager layers' on a fresh input, and read each graph
from the driver (nodes per type, edges by kind, kernel launches) to compare SAVE's captured graphs
with the restored and the recaptured ones. Times are GPU time per replay (CUDA events around a
run of back-to-back replays), medians of several runs. Run it again with
NCCL_GRAPH_MIXING_SUPPORT=0 to take NCCL's event nodes out of the graphs.

Usage (two GPUs, the library built): python scripts/tp_replay_probe.py DIR [LOADS]
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu" / "programs"))
from _common import REGION_BASE, REGION_SIZE, edge_kinds, graph_shape, kernel_launches, template_graph  # noqa: E402

SIZES = (1, 8, 32, 128)
LAYERS, HIDDEN, INTER = 36, 4096, 12288
RUNS, REPLAYS = 10, 20
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def per_replay_ms(replays) -> list[float]:
    """Median over RUNS of the GPU time of REPLAYS back-to-back replays of each callable in turn,
    per replay; several callables alternate run by run."""
    import torch

    times: list[list[float]] = [[] for _ in replays]
    for run in range(RUNS + 2):
        for i, replay in enumerate(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(REPLAYS):
                replay()
            end.record()
            end.synchronize()
            if run >= 2:  # the first two runs warm up
                times[i].append(start.elapsed_time(end) / REPLAYS)
    return [round(statistics.median(t), 4) for t in times]


def build(world: int):
    """Weights and an input; step(b) runs the layers for batch b."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    dt = torch.bfloat16

    def weight(rows: int, cols: int):  # small enough that 36 layers stay finite
        return torch.randn(rows, cols, device="cuda", dtype=dt) * (0.1 / rows ** 0.5)

    layers = [(weight(HIDDEN // world, HIDDEN), weight(HIDDEN, 2 * INTER // world), weight(INTER // world, HIDDEN))
              for _ in range(LAYERS)]
    x = torch.randn(max(SIZES), HIDDEN, device="cuda", dtype=dt) * 0.1

    def step(b: int):
        h = x[:b]
        for w_o, w_up, w_down in layers:
            a = h[:, : HIDDEN // world] @ w_o  # attention's output projection, row-parallel
            dist.all_reduce(a)
            h = h + a
            gate, up = (h @ w_up).chunk(2, dim=-1)
            m = (torch.nn.functional.silu(gate) * up) @ w_down
            dist.all_reduce(m)
            h = h + m
        return h
    return x, step


def capture(step, new_graph, graph_context):
    import torch

    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    for b in sorted(SIZES, reverse=True):
        g = new_graph()
        with graph_context(g, pool=pool):
            out = step(b)
        graphs[f"b{b}"] = (g, out)
    return graphs


def graph_summary(raw_graph: int) -> dict:
    """Node counts per type, edges by kind, and how many launches of each kernel (name, grid,
    block, shared memory), read from the driver."""
    launches = collections.Counter(f"{k['name'][:90]} {k['grid']} {k['block']} {k['shared']}"
                                   for k in kernel_launches(raw_graph))
    return {"shape": graph_shape(raw_graph), "launches": dict(launches), "edges": edge_kinds(raw_graph)}


def outputs_check(x, step, pairs) -> dict:
    """For each batch: the graphs' outputs against the eager layers' on a fresh input."""
    import torch

    torch.manual_seed(1234)
    x.copy_(torch.randn_like(x) * 0.1)
    out = {}
    for b in SIZES:
        eager = step(b).clone()
        row = {}
        for label, (replay, output) in pairs(b).items():
            replay()
            torch.cuda.synchronize()
            row[label] = float((output.float() - eager.float()).abs().max())
        out[f"b{b}"] = row
    return out


def rank_main(mode: str, directory: Path) -> None:
    import torch
    import torch.distributed as dist

    import foundry_core as fdry

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    mine = directory / f"rank{rank}"
    if mode == "load":
        fdry.load_cuda_modules_and_libraries(mine)
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    fdry.stop_allocation_region()  # NCCL's communicator outside the region (its layout varies)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    warm = torch.ones(1024, device="cuda")
    dist.all_reduce(warm)
    torch.cuda.synchronize()
    del warm
    torch.cuda.empty_cache()
    fdry.resume_allocation_region()
    x, step = build(world)
    for b in SIZES:
        step(b)
    torch.cuda.synchronize()
    result: dict = {"rank": rank}
    if mode == "save":
        graphs = capture(step, fdry.CUDAGraph, fdry.graph)
        fdry.save_graphs(mine, graphs)
        result["captured_ms"] = {n: per_replay_ms([g.replay])[0] for n, (g, _) in graphs.items()}
        result["max_abs_diff_vs_eager"] = outputs_check(
            x, step, lambda b: {"captured": (graphs[f"b{b}"][0].replay, graphs[f"b{b}"][1])})
        result["graphs"] = {n: graph_summary(g.raw_cuda_graph()) for n, (g, _) in graphs.items()}
    else:
        start = time.perf_counter()
        archive = fdry.load_graphs(mine)
        result["restore_s"] = round(time.perf_counter() - start, 3)
        result["nccl_events_bound"] = archive.times.nccl_events
        restored = {archive[i].name: archive[i] for i in range(len(archive))}
        result["restored_ms"] = {n: per_replay_ms([g.replay])[0] for n, g in restored.items()}
        fresh = capture(step, lambda: torch.cuda.CUDAGraph(keep_graph=True), torch.cuda.graph)  # as an engine captures
        pairs = {n: per_replay_ms([restored[n].replay, fresh[n][0].replay]) for n in restored}
        result["alternating_restored_ms"] = {n: p[0] for n, p in pairs.items()}
        result["alternating_recaptured_ms"] = {n: p[1] for n, p in pairs.items()}
        index = {archive[i].name: i for i in range(len(archive))}
        result["max_abs_diff_vs_eager"] = outputs_check(x, step, lambda b: {
            "restored": (restored[f"b{b}"].replay, archive.outputs(index[f"b{b}"])),
            "recaptured": (fresh[f"b{b}"][0].replay, fresh[f"b{b}"][1])})
        result["graphs"] = {n: graph_summary(template_graph(archive, i)) for n, i in index.items()}
        result["recaptured_graphs"] = {n: graph_summary(g.raw_cuda_graph()) for n, (g, _) in fresh.items()}
    (directory / f"{mode}-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    os._exit(0)  # tearing NCCL down under live graphs can block


def launch(mode: str, directory: Path, tag: str) -> list[dict]:
    from foundry_core.preload import preload_environment

    env = preload_environment(dict(os.environ, PYTHONUNBUFFERED="1", **NO_MULTICAST))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, mode, str(directory)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    results = [json.loads((directory / f"{mode}-rank{r}.json").read_text()) for r in (0, 1)]
    for r in results:
        (directory / f"{tag}-rank{r['rank']}.json").write_text(json.dumps(r))
    return results


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in ("save", "load"):
        rank_main(sys.argv[1], Path(sys.argv[2]))
        return
    loads = sys.argv[2] if len(sys.argv) == 3 else "2"
    if len(sys.argv) not in (2, 3) or not loads.isdigit() or int(loads) < 1:
        raise SystemExit("usage: python scripts/tp_replay_probe.py DIR [LOADS: LOAD processes, at least 1]")
    directory, loads = Path(sys.argv[1]), int(loads)
    directory.mkdir(parents=True, exist_ok=True)
    rows = [("save", launch("save", directory, "save"))]
    rows += [(f"load-{i}", launch("load", directory, f"load-{i}")) for i in range(1, loads + 1)]
    for tag, results in rows:
        for r in results:
            keys = [k for k in r if k.endswith("_ms")]
            line = "  ".join(f"{k[:-3]} " + " ".join(f"{n}={v:.4f}" for n, v in r[k].items()) for k in keys)
            extra = f"  restore {r['restore_s']} s, {r['nccl_events_bound']} NCCL events bound" if "restore_s" in r else ""
            print(f"{tag} rank{r['rank']}: {line}{extra}", flush=True)
            print(f"  max |graph - eager|: {r['max_abs_diff_vs_eager']}", flush=True)
    save, load = rows[0][1][0], rows[1][1][0]
    for name, captured in save["graphs"].items():
        for label, other in (("restored", load["graphs"][name]), ("recaptured", load["recaptured_graphs"][name])):
            print(f"{name} rank0 {label} vs SAVE's captured: shape {other['shape']} vs {captured['shape']}", flush=True)
            print(f"    edges {label} {other['edges']} captured {captured['edges']}", flush=True)
            a, b = collections.Counter(captured["launches"]), collections.Counter(other["launches"])
            for k in sorted(set(a) | set(b)):
                if a[k] != b[k]:
                    print(f"    {a[k]} captured, {b[k]} {label}: {k}", flush=True)


if __name__ == "__main__":
    main()
