"""A run's result file (JSON) and its tables.

The file holds every start (kind, round, command, environment changes, log, raw phase times,
engine-reported durations, what Foundry did and its seconds on the critical path, what a cold
start's caches held after it), the summary and the environment facts, so that `foundry ready
report` can print and draw it again anywhere.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from rich.table import Table

from foundry_core.ready.engines import PHASE_LABELS, PHASES
from foundry_core.ready.facts import bytecode_missing
from foundry_core.ready.stats import Spread, spread

FORMAT = "foundry-ready"
VERSION = 1


def write(result: dict, path: Path) -> None:
    """Writes ``result`` whole, through a temporary file, so a reader never sees half of it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "version": VERSION, **result}, indent=1) + "\n")
    tmp.replace(path)


def read(path: Path) -> dict:
    """A result file written by :func:`write`; anything else is refused with the reason."""
    path = Path(path)
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as exc:  # a directory, a file this user may not read
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc}); give a run's ready-ENGINE.json") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(result, dict) or result.get("format") != FORMAT:
        raise ValueError(f"{path}: not a `foundry ready` result (no \"format\": \"{FORMAT}\")")
    if result.get("version") != VERSION:
        raise ValueError(f"{path}: result version {result.get('version')!r}, this Foundry reads version {VERSION}")
    for key in ("engine", "kinds", "starts", "summary"):
        if key not in result:
            raise ValueError(f"{path}: the result has no {key!r}")
    return result


def _title(result: dict) -> str:
    env = result.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name")
    version = env.get("engine_version")
    parts = [f"{result['engine']}{' ' + version if version else ''}", result.get("model", "")]
    if gpu:
        parts.append(gpu)
    return "time to ready, s from exec: median (min-max) — " + ", ".join(p for p in parts if p)


CRITICAL_LABEL = "Foundry's critical path"


def _critical_cell(summary: dict) -> str:
    """The kind's Foundry critical path, s (3 decimals: its budget is tenths of a second); "-"
    when no start logged one (an unmodified start, or a result from before it was measured)."""
    d = summary.get("foundry_critical_s")
    return spread(d).text(3) if d else "-"


def phases_table(result: dict) -> Table:
    """One row per kind, one column per phase, and Foundry's critical path."""
    table = Table(title=_title(result))
    table.add_column("kind")
    table.add_column("starts ok", justify="right")
    table.add_column("foundry")
    for phase in PHASES:
        table.add_column(PHASE_LABELS[phase], justify="right")
    table.add_column(CRITICAL_LABEL, justify="right")
    for kind in result["kinds"]:
        s = result["summary"][kind]
        # "-": the start had no Foundry line (an unmodified start's is none)
        outcomes = ", ".join(f"{'none' if name == '-' else name} {n}" for name, n in sorted(s["foundry"].items()))
        outcomes = outcomes or "-"
        cells = [spread(s["phases"][p]).text() if p in s["phases"] else "-" for p in PHASES]
        table.add_row(kind, f"{s['ok']}/{s['starts']}", outcomes, *cells, _critical_cell(s))
    return table


def critical_table(result: dict) -> Table | None:
    """Foundry's critical path by item, one row each (the total first, the overlapped items
    last, marked as not in it), one column per kind; None when no start logged one."""
    summaries = [result["summary"][kind] for kind in result["kinds"]]
    if not any(s.get("foundry_critical_s") for s in summaries):
        return None
    table = Table(title=f"{CRITICAL_LABEL} by item, s: median (min-max)")
    table.add_column("item")
    for kind in result["kinds"]:
        table.add_column(kind, justify="right")
    table.add_row("total", *[_critical_cell(s) for s in summaries])
    for key, label in (("foundry_critical", "{}"), ("foundry_overlapped", "{} (overlapped, not in the total)")):
        names: list[str] = []
        for s in summaries:
            names += [n for n in s.get(key) or {} if n not in names]
        for name in names:
            cells = [spread(d).text(3) if (d := (s.get(key) or {}).get(name)) else "-" for s in summaries]
            table.add_row(label.format(name), *cells)
    return table


def durations_table(result: dict) -> Table | None:
    """The durations the engine reported itself, one row each, one column per kind."""
    names: list[str] = []
    for kind in result["kinds"]:
        names += [n for n in result["summary"][kind]["durations"] if n not in names]
    if not names:
        return None
    table = Table(title="engine-reported durations, s: median (min-max)")
    table.add_column("duration")
    for kind in result["kinds"]:
        table.add_column(kind, justify="right")
    for name in names:
        row = []
        for kind in result["kinds"]:
            d = result["summary"][kind]["durations"].get(name)
            row.append(spread(d).text(2) if d else "-")
        table.add_row(name, *row)
    return table


MIB = 2 ** 20


def _with_inventory(result: dict, kind: str) -> list[dict]:
    """The kind's recorded starts that list their caches (cold kinds since ``caches_after`` was
    recorded), those that did not reach ready too: the slowest start is the one to explain."""
    return [s for s in result["starts"]
            if s["kind"] == kind and s.get("recorded", True) and s.get("caches_after")]


def cold_caches_tables(result: dict) -> list[Table]:
    """Per kind with ``caches_after``, what its caches held after each start (placed from the archive
    plus compiled by the start): one row per variable that held a file in any start, with median
    (min-max) files and MiB over the starts, and where it was recorded the files the archive does
    not carry (the start wrote them); empty for a result from before it was recorded."""
    tables = []
    for kind in result["kinds"]:
        starts = _with_inventory(result, kind)
        if not starts:
            continue
        table = Table(title=f"{kind} caches after the start: median (min-max) of {len(starts)}")
        table.add_column("variable")
        table.add_column("files", justify="right")
        table.add_column("MiB", justify="right")
        compared = any("not_carried" in h for s in starts for h in s["caches_after"].values())
        if compared:
            table.add_column("not from the archive", justify="right")
        names: list[str] = []
        for s in starts:
            names += [n for n in s["caches_after"] if n not in names]
        for name in names:
            held = [s["caches_after"].get(name) or {} for s in starts]
            files = [h.get("files", 0) for h in held]
            if any(files):
                mib = [h.get("bytes", 0) / MIB for h in held]
                row = [name, Spread.of(files).text(0), Spread.of(mib).text(1)]
                if compared:  # over the starts whose caches were compared
                    counts = [h["not_carried"] for h in held if "not_carried" in h]
                    row.append(Spread.of(counts).text(0) if counts else "-")
                table.add_row(*row)
        if not table.rows:
            table.caption = "no cache held a file"
        tables.append(table)
    return tables


def failures(result: dict) -> list[str]:
    """One line per recorded start that did not reach ready or did not do what its kind asks."""
    lines = []
    for s in result["starts"]:
        if not s.get("recorded", True):
            continue
        where = f"round {s['round']} {s['kind']}"
        if not s.get("ok"):
            lines.append(f"{where}: {s.get('error') or 'failed'} (log: {s.get('log')})")
        elif s["kind"].startswith("load") and s.get("foundry") != "restored":
            lines.append(f"{where}: Foundry did not restore (it says: {s.get('foundry')}); log: {s.get('log')}")
        elif s["kind"] == "save" and s.get("foundry") != "saved":
            lines.append(f"{where}: Foundry did not save (it says: {s.get('foundry')}); log: {s.get('log')}")
    return lines


def compiled(result: dict) -> list[str]:
    """One line per recorded start that ran compilers (its ``compilers``, from
    :class:`~foundry_core.ready.compilers.CompilerWatch`), with how many of each: a LOAD is meant
    to compile nothing, and where another kind compiles tells what a LOAD was spared."""
    lines = []
    for s in result["starts"]:
        commands = s.get("compilers") or []
        if not s.get("recorded", True) or not commands:
            continue
        counts = Counter(os.path.basename(c.split(" ", 1)[0]) for c in commands)
        shown = ", ".join(f"{name} ({n})" for name, n in counts.most_common())
        total = s.get("compiler_processes") or len(commands)
        among = shown if total == len(commands) else f"the first {len(commands)}: {shown}"
        lines.append(f"round {s['round']} {s['kind']} ran {total} compiler processes: {among}")
    return lines


NOT_CARRIED_SHOWN = 5


def not_carried(result: dict) -> list[str]:
    """One line per recorded cold start whose caches held files the archive does not carry
    (``caches_after``'s ``not_carried``): what that LOAD compiled on a new host, by variable."""
    lines = []
    for s in result["starts"]:
        held = s.get("caches_after") or {}
        parts = []
        for name, listing in held.items():
            count = listing.get("not_carried") or 0
            if count:
                paths = listing.get("not_carried_paths") or []
                shown = ", ".join(paths[:NOT_CARRIED_SHOWN])
                shown_n = min(len(paths), NOT_CARRIED_SHOWN)
                more = f" and {count - shown_n} more" if count > shown_n else ""
                parts.append(f"{name} {count} ({shown}{more})")
        if s.get("recorded", True) and parts:
            lines.append(f"round {s['round']} {s['kind']} wrote files the archive does not carry: {'; '.join(parts)}")
    return lines


def print_result(result: dict, console) -> None:
    console.print(phases_table(result))
    for extra in (durations_table(result), critical_table(result), *cold_caches_tables(result)):
        if extra is not None:
            console.print(extra)
    bytecode = bytecode_missing((result.get("environment") or {}).get("engine_bytecode"), result["engine"])
    for line in (*compiled(result), *not_carried(result), *bytecode):
        console.print(f"[yellow]{line}[/yellow]")
    for line in failures(result):
        console.print(f"[yellow]{line}[/yellow]")
