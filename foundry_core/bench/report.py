"""Tables, JSON and charts for `foundry demo` and `foundry bench`."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from foundry_core.sizes import format_size


def capture_with_warmup(result: dict) -> float:
    s = result["save"]
    return s["warmup_s"] + s["capture_s"]


def summary_table(result: dict, title: str) -> Table:
    s = result["save"]
    capture = capture_with_warmup(result)
    table = Table(title=title)
    for col in ("graphs", "groups", "capture s (with warmup)", "restore mode", "restore s", "first replay s",
                "speed-up", "outputs identical"):
        table.add_column(col, justify="right")
    for mode, r in result["load"].items():
        ready = r["all_ready_s"]
        table.add_row(str(s["graphs"]), str(s["groups"]), f"{capture:.2f}", mode, f"{ready:.3f}",
                      f"{r['first_replay_s']:.3f}", f"{capture / ready:.0f}x" if ready > 0 else "-",
                      "[green]yes[/green]" if result["identical"][mode] else "[red]NO[/red]")
    return table


def phases_table(result: dict) -> Table:
    table = Table(title="restore phases (s)")
    names = list(next(iter(result["load"].values()))["phases_s"])
    table.add_column("mode")
    for n in names:
        table.add_column(n, justify="right")
    for mode, r in result["load"].items():
        table.add_row(mode, *(f"{r['phases_s'][n]:.4f}" for n in names))
    return table


def first_replay_table(result: dict) -> Table | None:
    """Where the first replay's seconds went, per mode (from the return of LOAD)."""
    rows = {mode: r["first_replay_phases_s"] for mode, r in result["load"].items() if r.get("first_replay_phases_s")}
    if not rows:
        return None
    table = Table(title="first replay after LOAD returned (s)")
    names = list(next(iter(rows.values())))
    table.add_column("mode")
    for n in names:
        table.add_column(n, justify="right")
    for mode, phases in rows.items():
        table.add_row(mode, *(f"{phases.get(n, 0.0):.4f}" for n in names))
    return table


def _pct(a: float | None, b: float | None) -> str:
    return f"{(b - a) / a * 100:+.2f}%" if a and b else "-"


def latency_table(result: dict) -> Table | None:
    """GPU time of one replay (launch hidden), across processes and within the SAVE process, and
    the host time of the replay call."""
    native = result["save"].get("latency_us") or {}
    if not native:
        return None
    restored_run = result["load"][result["modes"][0]]
    restored = restored_run.get("latency_us") or {}
    same = result["save"].get("same_process_latency_us") or {}
    launch_native = result["save"].get("launch_us") or {}
    launch_restored = restored_run.get("launch_us") or {}
    table = Table(title="replay, median µs (GPU time by CUDA events; launch = host time of the call)")
    for col in ("batch", "captured", "restored", "difference", "same process: captured", "restored",
                "difference", "launch: captured", "restored"):
        table.add_column(col, justify="right")
    for b in native:
        n, r = native[b], restored.get(b)
        pair = same.get(b) if isinstance(same.get(b), dict) else {}
        sc, sr = pair.get("captured"), pair.get("restored")
        ln, lr = launch_native.get(b), launch_restored.get(b)
        table.add_row(b, f"{n:.1f}", f"{r:.1f}" if r else "-", _pct(n, r), f"{sc:.1f}" if sc else "-",
                      f"{sr:.1f}" if sr else "-", _pct(sc, sr), f"{ln:.1f}" if ln else "-", f"{lr:.1f}" if lr else "-")
    return table


def print_report(result: dict, title: str, console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(result, title))
    console.print(phases_table(result))
    first = first_replay_table(result)
    if first is not None:
        console.print(first)
    lat = latency_table(result)
    if lat is not None:
        console.print(lat)
    s = result["save"]
    if isinstance(s.get("same_process_latency_us"), dict) and "error" in s["same_process_latency_us"]:
        console.print(f"same-process comparison not made: {s['same_process_latency_us']['error']}")
    if s.get("native_instantiate_s") is not None:
        console.print(f"the driver instantiates the {s['graphs']} captured graphs again in {s['native_instantiate_s']:.2f} s "
                      "(the instantiation cost inside capture)")
    console.print(f"archive {format_size(result['archive_bytes'])} on disk: images {format_size(result['image_bytes'])}, "
                  f"{s['nodes']} nodes ({(result['archive_bytes'] - result['image_bytes']) / max(s['nodes'], 1):.0f} "
                  "bytes per node besides images)")


def write_results(result: dict, path: Path, command: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": command, **result}, indent=1, sort_keys=True))
    return path


def write_chart(result: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = ["capture + warmup"] + [f"restore ({m})" for m in result["load"]]
    values = [capture_with_warmup(result)] + [r["all_ready_s"] for r in result["load"].values()]
    ax1.bar(labels, values, color=["#888"] + ["#2a7"] * len(result["load"]))
    ax1.set_ylabel("seconds")
    ax1.set_title(f"{result['save']['graphs']} decode graphs")
    ax1.tick_params(axis="x", rotation=20)
    native = result["save"].get("latency_us") or {}
    restored = result["load"][result["modes"][0]].get("latency_us") or {}
    if native:
        xs = list(native)
        ax2.plot(xs, [native[x] for x in xs], "o-", label="captured")
        ax2.plot(xs, [restored.get(x, float("nan")) for x in xs], "s--", label="restored")
        ax2.set_xlabel("batch size")
        ax2.set_ylabel("replay µs (median)")
        ax2.legend()
        ax2.set_title("replay latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
