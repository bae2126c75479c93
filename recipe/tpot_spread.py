"""Per-start timings (TPOT, time to first token) over repeated starts, against the reference's spread.

Usage: python recipe/tpot_spread.py DIR [--reference NAME] [--key KEY] [--label b|n] [--of median|min]

Reads DIR/<kind>-<n>.json and DIR/<kind>.json (start 0 of its kind): the recipes' per-start
results, each with ``tpot_ms`` per batch size (or KEY: SGLang's ``step_tpot_ms``, or ``ttft_ms`` per
prompt length with ``--label n``; a key of samples, ``ttft_samples_ms``, is reduced per start by
``--of``). Prints, per kind and column, the median over its starts and
their range; then, per other kind, its median against the reference's (default: the first kind
in name order) next to the reference's own range. Two starts replaying the same natively
captured graphs differ by a few percent (process start, memory placement, host load), so a
difference inside that range says nothing; repeated starts are what can tell a 1 % difference
from it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


# How a start's samples (a list per column, e.g. ``ttft_samples_ms``) become its one number.
OF = {"median": statistics.median, "min": min}


def runs_by_kind(directory: Path, key: str = "tpot_ms", of: str = "median") -> dict[str, list[dict[str, float]]]:
    """{kind: [KEY of each start]}, starts in number order (<kind>.json first). A column holding
    a start's samples is taken as their ``of`` (:data:`OF`)."""
    found: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for path in directory.glob("*.json"):
        m = re.fullmatch(r"(.+)-(\d+)", path.stem)
        kind, number = (m.group(1), int(m.group(2))) if m else (path.stem, 0)
        tpot = json.loads(path.read_text()).get(key) or {}
        columns = {str(b): float(OF[of](v)) if isinstance(v, list) else float(v) for b, v in tpot.items()
                   if not isinstance(v, list) or v}
        if columns:
            found.setdefault(kind, []).append((number, columns))
    return {kind: [t for _, t in sorted(starts)] for kind, starts in sorted(found.items())}


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def table(kinds: dict[str, list[dict[str, float]]], reference: str, label: str = "b", unit: str = "ms") -> list[str]:
    """LABEL prefixes each column's key: b for a batch size, n for a prompt length in tokens;
    UNIT names what the numbers count (ms, or faults for ``ttft_faults``)."""
    batches = sorted({b for starts in kinds.values() for t in starts for b in t}, key=int)
    lines = ["| kind | starts | " + " | ".join(f"{label}{b} {unit} median (min-max)" for b in batches) + " |",
             "|" + "---|" * (len(batches) + 2)]
    for kind, starts in kinds.items():
        cells = []
        for b in batches:
            values = [t[b] for t in starts if b in t]
            cells.append("%.3f (%.3f-%.3f)" % spread(values) if values else "-")
        lines.append(f"| {kind} | {len(starts)} | " + " | ".join(cells) + " |")
    lines += ["", f"| kind vs {reference} | " + " | ".join(f"{label}{b}" for b in batches) + " |",
              "|" + "---|" * (len(batches) + 1)]
    ref = kinds[reference]
    ref_range = []
    for b in batches:
        values = [t[b] for t in ref if b in t]
        med, lo, hi = spread(values) if values else (0.0, 0.0, 0.0)  # a column the reference lacks: "-"
        ref_range.append(f"{(lo - med) / med * 100:+.1f} / {(hi - med) / med * 100:+.1f} %" if med else "-")
    lines.append(f"| {reference}: its own starts' range around its median | " + " | ".join(ref_range) + " |")
    for kind, starts in kinds.items():
        if kind == reference:
            continue
        cells = []
        for b in batches:
            ours, theirs = [t[b] for t in starts if b in t], [t[b] for t in ref if b in t]
            if ours and theirs and statistics.median(theirs):
                cells.append(f"{(statistics.median(ours) / statistics.median(theirs) - 1) * 100:+.1f} %")
            else:
                cells.append("-")
        lines.append(f"| {kind}: median against {reference}'s | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--reference")
    p.add_argument("--key", default="tpot_ms", help="the per-start numbers to compare (default: tpot_ms)")
    p.add_argument("--label", default="b", help="the column prefix: b (batch size, default) or n (prompt tokens, ttft_ms)")
    p.add_argument("--unit", default="ms", help="what the numbers count, for the header (default: ms)")
    p.add_argument("--of", choices=sorted(OF), default="median",
                   help="a start's number where KEY holds its samples (ttft_samples_ms): their median (default) "
                        "or their minimum, the request least disturbed by the host")
    args = p.parse_args(argv)
    kinds = runs_by_kind(args.dir, args.key, args.of)
    if not kinds:
        print(f"no <kind>-<n>.json with {args.key} in {args.dir}", file=sys.stderr)
        return 1
    reference = args.reference or next(iter(kinds))
    if reference not in kinds:
        print(f"no starts of kind {reference!r} in {args.dir} (found {', '.join(kinds)})", file=sys.stderr)
        return 1
    print("\n".join(table(kinds, reference, args.label, args.unit)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
