"""A start's log, read back: when each phase's line arrived, the durations the engine reported and
what Foundry did.

Foundry's critical-path lines (one per process that recorded any,
:mod:`foundry_core.engine.critical_path`) are combined into the start's: ``LogTimes.critical``.

The harness stamps every line of the server's merged stdout/stderr on arrival (seconds from exec,
monotonic clock) and writes it as ``"<seconds> <line>"``: :func:`stamp` and :func:`read_stamped`
are the two directions of that format.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from foundry_core.engine import critical_path
from foundry_core.ready.engines import FOUNDRY_OUTCOMES, Engine, compiled

StampedLine = tuple[float, str]
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STAMPED = re.compile(r"^\s*(\d+\.\d+) (.*)$")


def stamp(seconds: float, line: str) -> str:
    return f"{seconds:10.3f} {line}"


def read_stamped(path: Path) -> list[StampedLine]:
    """The lines of a stamped log; a line without a stamp (not written by the harness) is refused."""
    lines = []
    for number, text in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        m = _STAMPED.match(text)
        if not m:
            raise ValueError(f"{path}:{number}: not a stamped line (expected '<seconds> <text>'): {text[:80]!r}")
        lines.append((float(m.group(1)), m.group(2)))
    return lines


def clean(line: str) -> str:
    """The line as matched: colour codes removed (an engine forced to colour its logs)."""
    return _ANSI.sub("", line)


# What a trimmed log (``--keep-logs tail``) keeps wherever it comes, beside the lines that marked
# something: Foundry's own lines (its messages start "foundry:", its loggers and plugins are named
# foundry.*, *_foundry; its warnings about cache files it did not place among them), warnings and
# the start of a traceback, so a slow or failed start can still be explained. Not any path with
# "foundry" in it: the harness's own work directory is in many of an engine's lines.
KEPT_CASELESS = ("foundry:", "[foundry", "_foundry")
KEPT_EXACT = ("WARNING", "Traceback")


def always_kept(line: str) -> bool:
    """Whether a trimmed log keeps ``line`` wherever it comes (:data:`KEPT_CASELESS`, :data:`KEPT_EXACT`)."""
    line = clean(line)
    lowered = line.lower()
    return any(word in lowered for word in KEPT_CASELESS) or any(word in line for word in KEPT_EXACT)


@dataclass
class LogTimes:
    """What one start's log says: ``phases`` and ``markers`` are seconds from exec of the first
    matching line, ``durations`` the first value the engine reported for each, ``foundry`` one of
    "saved", "restored", "fell back" or "-" (Foundry said nothing), ``critical`` Foundry's seconds
    on the start's critical path from its processes' lines (None: no process logged one)."""

    phases: dict[str, float] = field(default_factory=dict)
    markers: dict[str, float] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    foundry: str = "-"
    critical: critical_path.Combined | None = None
    matched_lines: set[int] = field(default_factory=set)


def parse(engine: Engine, lines: Iterable[StampedLine]) -> LogTimes:
    """The first line matching each of the engine's patterns, with its arrival time."""
    phases, markers, durations = compiled(engine.phases), compiled(engine.markers), compiled(engine.durations)
    outcomes = [(name, re.compile(p)) for name, p in FOUNDRY_OUTCOMES]
    found = LogTimes()
    seen_outcomes: set[str] = set()
    reported: list[critical_path.ReportedLine] = []
    for index, (seconds, raw) in enumerate(lines):
        line = clean(raw)
        if (critical := critical_path.parse_line(line)) is not None:
            reported.append(critical)
            found.matched_lines.add(index)
        for table, target in ((phases, found.phases), (markers, found.markers)):
            for name, pattern in table.items():
                if name not in target and pattern.search(line):
                    target[name] = seconds
                    found.matched_lines.add(index)
        for name, pattern in durations.items():
            if name not in found.durations:
                m = pattern.search(line)
                if m:
                    found.durations[name] = float(m.group(1))
                    found.matched_lines.add(index)
        for name, pattern in outcomes:
            if pattern.search(line):
                seen_outcomes.add(name)
                found.matched_lines.add(index)
    # A fallback outweighs anything else the start said (it may still have saved a fresh archive).
    found.foundry = next((name for name, _ in FOUNDRY_OUTCOMES if name in seen_outcomes), "-")
    found.critical = critical_path.combine(reported)
    return found
