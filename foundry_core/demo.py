"""`foundry demo` and `foundry bench`: SAVE then LOAD of decode graphs of the built-in model."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console

from foundry_core.errors import FoundryError

DEMO_SIZES = list(range(1, 257))
LATENCY_SIZES = [1, 8, 32, 128, 256]


def _parse_sizes(text: str) -> list[int]:
    sizes: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            sizes.extend(range(int(lo), int(hi) + 1))
        elif part:
            sizes.append(int(part))
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"not a list of batch sizes: {text!r} (e.g. 1-256 or 1,8,32)")
    return sorted(set(sizes))


def _require_gpu(console: Console, what: str) -> bool:
    from foundry_core.bench.run import gpu_unavailable

    reason = gpu_unavailable()
    if reason:
        console.print(f"[yellow]foundry {what} needs an NVIDIA GPU with its driver and PyTorch with CUDA: {reason}.[/yellow]\n"
                      "`foundry doctor` shows what this machine has.")
        return False
    return True


def main(args: argparse.Namespace) -> int:
    """foundry demo: 256 decode graphs of a small decoder, SAVE in one process, LOAD in another."""
    from foundry_core.bench.report import print_report
    from foundry_core.bench.run import BenchConfig, run
    from foundry_core.model import SHAPES

    console = Console(stderr=False)
    if not _require_gpu(console, "demo"):
        return 1
    max_b = max(DEMO_SIZES)
    cfg = BenchConfig(model={**SHAPES["small"].as_dict(), "max_batch": max_b}, sizes=DEMO_SIZES, modes=["eager"])
    console.print(f"SAVE: warming up and capturing {len(DEMO_SIZES)} decode graphs (batch 1..{max_b}) in a child process...")
    try:
        result = run(cfg)
    except FoundryError as exc:
        console.print(f"[red]demo failed:[/red] {exc}")
        return 1
    print_report(result, "foundry demo: SAVE once, LOAD in a fresh process", console)
    return 0 if all(result["identical"].values()) else 1


def bench(args: argparse.Namespace) -> int:
    """foundry bench: the full measurement (see --help)."""
    from foundry_core.bench.report import print_report, write_chart, write_results
    from foundry_core.bench.run import BenchConfig, run
    from foundry_core.model import SHAPES

    console = Console()
    if not _require_gpu(console, "bench"):
        return 1
    sizes = args.sizes
    model = {**SHAPES[args.shape].as_dict(), "max_batch": max(sizes)}
    if args.layers:
        model["layers"] = args.layers
    cfg = BenchConfig(model=model, sizes=sizes, variant=args.variant, modes=args.modes, threads=args.threads,
                      latency_sizes=[b for b in LATENCY_SIZES if b in sizes], reps=args.reps,
                      keep_archive=args.keep_archive)
    command = "foundry bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    try:
        result = run(cfg)
    except FoundryError as exc:
        console.print(f"[red]bench failed:[/red] {exc}")
        return 1
    name = args.name or f"{args.shape}-{args.variant}-{len(sizes)}graphs-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir = Path(args.results)
    json_path = write_results(result, out_dir / f"{name}.json", command)
    chart = write_chart(result, out_dir / f"{name}.png")
    print_report(result, f"foundry bench ({args.shape}, {args.variant})", console)
    console.print(f"results: {json_path}" + (f", chart: {chart}" if chart else " (matplotlib not installed: no chart)"))
    return 0 if all(result["identical"].values()) else 1


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", choices=["small", "8b"], default="8b", help="model shape (default: 8b, an 8B-class decoder)")
    p.add_argument("--layers", type=int, default=0, help="override the number of layers")
    p.add_argument("--sizes", type=_parse_sizes, default=DEMO_SIZES, help="batch sizes, e.g. 1-256 or 1,8,32 (default 1-256)")
    p.add_argument("--variant", choices=["eager", "compile"], default="eager", help="ATen kernels or torch.compile (Triton)")
    p.add_argument("--modes", type=lambda s: s.split(","), default=["eager", "parallel", "lazy"],
                   help="instantiation modes to measure, comma-separated: eager,parallel,lazy,background")
    p.add_argument("--threads", type=int, default=8, help="threads of the parallel mode")
    p.add_argument("--reps", type=int, default=200, help="replays per latency measurement")
    p.add_argument("--name", default=None, help="results file name (bench/results/<name>.json)")
    p.add_argument("--results", default="bench/results", help="results directory")
    p.add_argument("--keep-archive", metavar="DIR", default=None, help="copy the archive SAVE wrote to DIR")
