"""Median and range per kind, of each phase and each duration the engine reported, over the
recorded starts that reached ready."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Spread:
    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values to summarise")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def text(self, digits: int = 1) -> str:
        """``median (min-max)``, or the value alone for a single start."""
        if self.n == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} ({self.min:.{digits}f}-{self.max:.{digits}f})"


def _spreads(records: Iterable[dict], key: str) -> dict[str, Spread]:
    values: dict[str, list[float]] = {}
    for record in records:
        for name, value in (record.get(key) or {}).items():
            if value is not None:
                values.setdefault(name, []).append(float(value))
    return {name: Spread.of(v) for name, v in values.items()}


def _critical(records: Sequence[dict]) -> dict | None:
    values = [float(r["foundry_critical_s"]) for r in records if r.get("foundry_critical_s") is not None]
    return asdict(Spread.of(values)) if values else None


def summarise(starts: Sequence[dict], kinds: Sequence[str]) -> dict[str, dict]:
    """Per kind: ``starts`` (recorded), ``ok`` (reached ready and answered), ``phases`` and
    ``durations`` as {name: Spread as dict}, ``foundry`` as {outcome: count}, Foundry's critical
    path as ``foundry_critical_s`` (a Spread as dict, None when no start logged one),
    ``foundry_critical`` and ``foundry_overlapped`` ({item: Spread as dict}, over the starts that
    recorded the item). Starts that failed count in ``starts`` only."""
    summary = {}
    for kind in kinds:
        mine = [s for s in starts if s["kind"] == kind and s.get("recorded", True)]
        ok = [s for s in mine if s.get("ok")]
        summary[kind] = {
            "starts": len(mine),
            "ok": len(ok),
            "phases": {k: asdict(v) for k, v in _spreads(ok, "phases").items()},
            "durations": {k: asdict(v) for k, v in _spreads(ok, "durations").items()},
            "foundry": dict(Counter(s.get("foundry", "-") for s in ok)),
            "foundry_critical_s": _critical(ok),
            "foundry_critical": {k: asdict(v) for k, v in _spreads(ok, "foundry_critical").items()},
            "foundry_overlapped": {k: asdict(v) for k, v in _spreads(ok, "foundry_overlapped").items()},
        }
    return summary


def spread(d: dict) -> Spread:
    return Spread(**d)
