"""The kinds of start `foundry ready` compares, and the order it runs them in.

A kind turns (engine, the user's model and arguments, a work directory) into a :class:`StartPlan`:
the command and the environment changes of one start.

- ``base-warm``: the engine unmodified, its caches warm (the run's own, or the host's as they are
  without ``caches``; warmed first, see harness.py);
- ``base-cold``: unmodified, every cache location empty (a new host or container);
- ``save``: ``--foundry-archive`` with a fresh archive directory, ``--foundry-mode save``;
- ``load-warm``: ``--foundry-mode load`` of the latest SAVE's archive, its caches warm;
- ``load-cold``: the same LOAD on empty caches.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from foundry_core.ready.caches import cache_environment, cold_environment
from foundry_core.ready.engines import Engine

KINDS: tuple[str, ...] = ("base-warm", "base-cold", "save", "load-warm", "load-cold")
COLD_KINDS = frozenset({"base-cold", "load-cold"})
LOAD_KINDS = frozenset({"load-warm", "load-cold"})
# Variables a start of any kind leaves out: Foundry is asked for on the command line or not at all.
UNSET = ("FOUNDRY_ARCHIVE", "FOUNDRY_MODE")
# Flags the harness sets itself: given again by the user, the engine would take the user's.
OWN_FLAGS = ("--host", "--port", "--foundry-archive", "--foundry-mode")


@dataclass(frozen=True)
class ServerSpec:
    """What every start of a run shares: the engine, how to launch it, the model and the user's
    arguments (appended last, so they win where the engine takes the last of a repeated flag)."""

    engine: Engine
    model: str
    python: str
    extra_args: tuple[str, ...] = ()
    port: int = 30711
    command: str | None = None  # a template replacing the engine's, e.g. "{python} -m my.server {model}"

    def __post_init__(self) -> None:
        given = [a for a in self.extra_args if a.split("=", 1)[0] in OWN_FLAGS]
        if given:
            raise ValueError(f"{', '.join(given)}: the harness sets the host, the port and Foundry's flags itself "
                             "(use `foundry ready --port`; the kinds choose the archive and the mode)")

    def argv(self) -> list[str]:
        template = self.command or self.engine.command
        try:
            base = [part.format(python=self.python, model=self.model) for part in shlex.split(template)]
        except (KeyError, IndexError) as exc:
            raise ValueError(f"the command template {template!r} names an unknown field {exc} "
                             "(known: {python}, {model})") from None
        return [*base, "--host", "127.0.0.1", "--port", str(self.port)]


@dataclass(frozen=True)
class StartPlan:
    """One start: ``env`` holds the changes to the harness's environment (a value of None removes
    the variable), ``archive`` the Foundry archive it saves or loads."""

    kind: str
    argv: list[str]
    env: dict[str, str | None] = field(default_factory=dict)
    archive: Path | None = None


def plan(kind: str, spec: ServerSpec, work: Path, archive: Path | None = None,
         environ: Mapping[str, str] | None = None, caches: Path | None = None) -> StartPlan:
    """The start of ``kind``. ``work`` is this start's own empty directory; ``archive`` is the
    directory SAVE writes (fresh) or LOAD reads (the latest SAVE's). ``caches``: the run's own cache
    directory, which every kind points the cache variables at (the harness empties it around a cold
    start); without it warm kinds use the host's caches and cold kinds fresh ones under ``work``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    env: dict[str, str | None] = dict.fromkeys(UNSET)
    env["PYTHONUNBUFFERED"] = "1"  # each line reaches the harness when it is written, so its stamp is true
    if caches is not None:
        env.update(cache_environment(Path(caches), environ))
    elif kind in COLD_KINDS:
        env.update(cold_environment(Path(work) / "caches", environ))
    foundry: list[str] = []
    if kind == "save" or kind in LOAD_KINDS:
        if archive is None:
            raise ValueError(f"a {kind} start needs an archive directory")
        foundry = ["--foundry-archive", str(archive), "--foundry-mode", "save" if kind == "save" else "load"]
    base = spec.argv()
    return StartPlan(kind, [*base, *foundry, *spec.extra_args], env, archive)


@dataclass(frozen=True)
class Step:
    """A start in the run's order: ``recorded`` is False for the harness's own preparation starts."""

    kind: str
    round: int
    recorded: bool = True
    why: str = ""


def schedule(kinds: Sequence[str], rounds: int, warm_up: bool) -> list[Step]:
    """Round-robin: every round runs each kind once, in the order given, so that a drift of the
    host over time (page cache, clocks, other work) spreads over all kinds alike. Before the first
    start that needs them come the preparation starts: an unmodified one when the warm kinds need
    warm caches (``warm_up``: an unmodified start and, where the run has SAVE or LOAD kinds, a SAVE,
    whose settings may compile other code than an unmodified start's), and a SAVE when a LOAD would
    otherwise come before any SAVE."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown kind(s) {', '.join(unknown)} (known: {', '.join(KINDS)})")
    if not kinds:
        raise ValueError("no kinds to run")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"a kind is named twice in {','.join(kinds)}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    steps: list[Step] = []
    uses_foundry = any(k == "save" or k in LOAD_KINDS for k in kinds)
    if warm_up and any(k not in COLD_KINDS for k in kinds):
        steps.append(Step("base-warm", 0, False, "warm-up: the host's caches were empty"))
        if uses_foundry:
            steps.append(Step("save", 0, False, "warm-up of SAVE's settings; the archive for a first LOAD"))
    first_load = next((i for i, k in enumerate(kinds) if k in LOAD_KINDS), None)
    if first_load is not None and "save" not in kinds[:first_load] and not any(s.kind == "save" for s in steps):
        steps.append(Step("save", 0, False, "the archive for the first LOAD"))
    for r in range(1, rounds + 1):
        steps.extend(Step(k, r) for k in kinds)
    return steps
