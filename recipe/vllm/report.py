"""Tables from the JSON and logs that ``start.py`` runs leave behind.

Usage:
  python report.py timing DIR                           time to ready, graph phase, TPOT per run, and how
                                                        much shorter each LOAD's graph step is

``timing`` reads DIR/<run>.json and DIR/<run>.log for the runs captured-cold, captured-warm,
eager, save and load (those present, in that order, then any other run in DIR), and takes the startup steps from vLLM's and Foundry's log
lines, so every second from process start to ready is accounted for.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RUNS = ("baseline", "captured-cold", "captured-warm", "eager", "save", "load")
TPOT_BATCHES = ("1", "8", "32", "128")
# (label, pattern with one number group): the startup steps as the logs name them.
STEPS = (
    ("weights", r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    ("torch.compile", r"torch\.compile takes? ([\d.]+) s"),
    ("memory profiling", r"foundry: memory profiling took ([\d.]+) s"),
    ("graph capture (vLLM)", r"Graph capturing finished in ([\d.]+) secs"),
    ("capture/restore (foundry)", r"foundry: capture_model \(capture or restore\) took ([\d.]+) s"),
    ("JIT warmup", r"foundry: vLLM's JIT warmup .* took ([\d.]+) s"),
    ("compile caches into the archive", r"foundry: compile caches carried in the archive: .*, in ([\d.]+) s"),
    # What the start spent: the copy's time when the worker placed them, the wait when a thread did.
    ("compile caches from the archive", r"foundry: (?:compile|JIT) caches from the archive: .*(?: in|waited) ([\d.]+) s"),
    ("warmup total", r"foundry: compile_or_warm_up_model .* took ([\d.]+) s"),
    ("engine init (vLLM)", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
)


def load(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def steps(log: Path) -> dict[str, float]:
    """Seconds per startup step: summed within a process (a step may log once per compile range),
    the slowest process's where several log it (tensor-parallel ranks run the steps side by side)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = {}
    for label, pattern in STEPS:
        per_process: dict[str, float] = {}
        for line in text.splitlines():
            m = re.search(pattern, line)
            if m:
                pid = re.search(r"pid=(\d+)", line)
                key = pid.group(1) if pid else ""
                per_process[key] = per_process.get(key, 0.0) + float(m.group(1))
        if per_process:
            found[label] = max(per_process.values())
    return found


def outcome(log: Path) -> str:
    """What Foundry did in a start: saved, restored, fell back (a fallback's tokens still match, so
    the table must say it), or nothing."""
    text = log.read_text(errors="replace") if log.exists() else ""
    if re.search(r"foundry: restored \d+ graphs", text):
        return "restored"
    if re.search(r"\[foundry\] saved \d+ graphs \(", text):
        return "saved"
    if re.search(r"foundry: rank \d+ (cannot load|does not use|could not save)", text):
        return "FELL BACK"
    return "-"


def timing(directory: str) -> int:
    d = Path(directory)
    # The known runs in their order, then any other run of the directory (e.g. load-background).
    present = [r for r in RUNS if (d / f"{r}.json").exists()]
    present += sorted(p.stem for p in d.glob("*.json") if p.stem not in present)
    if not present:
        print(f"no runs in {d}")
        return 1
    # The reference: the unmodified start with graphs captured (warm compile cache), else the
    # cold one, else (a step without an unmodified start) the SAVE start, whose graphs are captured.
    ref_run = next((r for r in ("captured-warm", "baseline", "captured-cold", "save") if r in present), None)
    header = ["run", "ready s", *[f"TPOT b{b} ms" for b in TPOT_BATCHES], f"tokens vs {ref_run}", "foundry"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    ref = load(d / f"{ref_run}.json")["tokens"] if ref_run else None
    for run in present:
        r = load(d / f"{run}.json")
        tpot = [f"{r['tpot_ms'][b]:.2f}" if b in r.get("tpot_ms", {}) else "-" for b in TPOT_BATCHES]
        same = "-" if ref is None or run == ref_run else ("identical" if r["tokens"] == ref else "DIFFERENT")
        print(f"| {run} | {r['ready_s']:.1f} | " + " | ".join(tpot) + f" | {same} | {outcome(d / f'{run}.log')} |")
    print()
    labels = [label for label, _ in STEPS]
    table = {run: steps(d / f"{run}.log") for run in present}
    print("| step (s) | " + " | ".join(present) + " |")
    print("|" + "---|" * (len(present) + 1))
    for label in labels:
        if any(label in table[run] for run in present):
            print(f"| {label} | " + " | ".join(f"{table[run][label]:.2f}" if label in table[run] else "-"
                                                for run in present) + " |")
    for line in graph_step_ratios(table, {run: outcome(d / f"{run}.log") for run in present}):
        print(line)
    return 0


def graph_step_ratios(table: dict[str, dict[str, float]], outcomes: dict[str, str]) -> list[str]:
    """How much shorter each restoring start's graph step (vLLM's capture_model, as Foundry times
    it) is than SAVE's, and than the shortest capture of the unmodified starts (vLLM logs whole
    seconds)."""
    step = "capture/restore (foundry)"
    saved = [table[r][step] for r, o in outcomes.items() if o == "saved" and step in table[r]]
    unmodified = [table[r]["graph capture (vLLM)"] for r, o in outcomes.items()
                  if o == "-" and table[r].get("graph capture (vLLM)")]
    save_s, unmodified_s = max(saved, default=0.0), min(unmodified, default=0.0)
    lines = []
    for run, done in outcomes.items():
        seconds = table[run].get(step)
        if done != "restored" or not seconds:
            continue
        parts = [f"{save_s / seconds:.1f}x shorter than SAVE's {save_s:.2f} s"] if save_s else []
        if unmodified_s:
            parts.append(f"{unmodified_s / seconds:.1f}x than the unmodified start's {unmodified_s:.0f} s")
        lines.append(f"  {run}: graph step {seconds:.2f} s" + (": " + ", ".join(parts) if parts else ""))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "timing":
        return timing(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
