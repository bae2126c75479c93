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


def latency_table(result: dict) -> Table | None:
    native = result["save"].get("latency_us") or {}
    first_mode = result["modes"][0]
    restored = result["load"][first_mode].get("latency_us") or {}
    if not native:
        return None
    table = Table(title="replay latency, median (µs)")
    for col in ("batch", "captured", "restored", "difference"):
        table.add_column(col, justify="right")
    for b in native:
        n, r = native[b], restored.get(b)
        table.add_row(b, f"{n:.1f}", f"{r:.1f}" if r else "-", f"{(r - n) / n * 100:+.2f}%" if r else "-")
    return table


def print_report(result: dict, title: str, console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(result, title))
    console.print(phases_table(result))
    lat = latency_table(result)
    if lat is not None:
        console.print(lat)
    s = result["save"]
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
