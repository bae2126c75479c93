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


def summarise(starts: Sequence[dict], kinds: Sequence[str]) -> dict[str, dict]:
    """Per kind: ``starts`` (recorded), ``ok`` (reached ready and answered), ``phases`` and
    ``durations`` as {name: Spread as dict}, ``foundry`` as {outcome: count}. Starts that failed
    count in ``starts`` only."""
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
        }
    return summary


def spread(d: dict) -> Spread:
    return Spread(**d)
