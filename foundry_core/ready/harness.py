"""The measurement: starts of each kind in rounds, each timed from exec to its first completion.

Per start: the server is started (server.py), ``/health`` polled and one completion timed
(client.py), the server's group stopped, and its log read for the phases (logparse.py). The result
file is rewritten after every start, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from foundry_core.engine import critical_path
from foundry_core.ready import caches, client, compilers, facts, kinds, logparse, report, server, stats
from foundry_core.ready.engines import PHASES, Engine

logger = logging.getLogger("foundry.ready")

TAIL_LINES = 200
PORT_WAIT_S = 30.0
GPU_WAIT_S = 60.0
# How long a SAVE start keeps serving after its first completion before it is stopped: SGLang's
# SAVE goes on carrying the compile caches its first requests used (each entry within about a
# second of being complete: FOUNDRY_SGLANG_CACHE_WATCH), and a LOAD on empty caches needs those
# too. Not counted in any phase.
SAVE_SETTLE_S = 5.0


@dataclass(frozen=True)
class Options:
    """A run: ``keep_logs`` is "all" or "tail" (the lines that marked something, those
    :func:`logparse.always_kept` keeps, and the last :data:`TAIL_LINES`); ``warm_up`` is "auto"
    (when the engine's caches are empty), "always" or "never"; archives and cold caches go to a
    fresh directory made inside ``work`` (default: the system's temporary directory), removed at
    the end unless ``keep_work``."""

    spec: kinds.ServerSpec
    kinds: tuple[str, ...]
    rounds: int
    results: Path
    timeout_s: float = 900.0
    keep_logs: str = "all"
    warm_up: str = "auto"
    work: Path | None = None
    keep_work: bool = False
    # "run": every start's caches in the run's own directory, emptied around each cold start (a
    # new host with the same image: the same paths, nothing compiled; what an archive carries for
    # the saving host's paths then applies). "host": warm starts use the host's own caches, cold
    # ones a fresh directory each (a new host whose paths differ).
    caches: str = "run"


def host_is_warm(engine: Engine, environ: Mapping[str, str] | None = None) -> bool:
    """Whether every cache a first start of ``engine`` fills holds a file on this host."""
    return all(caches.holds_files(caches.location(var, environ) / below) for var, below in engine.warm_caches)


def result_path(results: Path, engine: Engine) -> Path:
    return Path(results) / f"ready-{engine.name}.json"


class Run:
    """One run of :class:`Options`; :meth:`execute` returns the result dict (also written to
    ``result_path``). ``progress`` receives one line per start."""

    def __init__(self, options: Options, progress: Callable[[str], None] = lambda line: None):
        if options.keep_logs not in ("all", "tail"):
            raise ValueError(f"keep_logs must be 'all' or 'tail', not {options.keep_logs!r}")
        if options.warm_up not in ("auto", "always", "never"):
            raise ValueError(f"warm_up must be 'auto', 'always' or 'never', not {options.warm_up!r}")
        if options.caches not in ("run", "host"):
            raise ValueError(f"caches must be 'run' or 'host', not {options.caches!r}")
        if options.timeout_s <= 0:
            raise ValueError(f"the per-start timeout must be positive, not {options.timeout_s}")
        self.options = options
        self.engine = options.spec.engine
        self.progress = progress
        self.results = Path(options.results)
        self.path = result_path(self.results, self.engine)
        self.archive: Path | None = None
        self.result: dict = {}

    def _warm_up_needed(self) -> bool:
        if self.options.warm_up == "auto":
            if self.options.caches == "run":
                return True  # the run's caches start empty
            return not host_is_warm(self.engine)
        return self.options.warm_up == "always"

    def _caches(self, work: Path) -> Path | None:
        return work / "caches" if self.options.caches == "run" else None

    def execute(self) -> dict:
        o = self.options
        steps = kinds.schedule(o.kinds, o.rounds, self._warm_up_needed())  # bad kinds or rounds: before anything
        if not server.port_free(o.spec.port):
            raise ValueError(f"port {o.spec.port} is in use: stop what listens there or pass another --port")
        self.results.mkdir(parents=True, exist_ok=True)
        if o.work is not None:
            Path(o.work).mkdir(parents=True, exist_ok=True)
        # A directory of its own: removing it at the end removes nothing the run did not make.
        work = Path(tempfile.mkdtemp(prefix="foundry-ready-", dir=o.work))
        self.result = {
            "engine": self.engine.name, "model": o.spec.model, "kinds": list(o.kinds), "rounds": o.rounds,
            "port": o.spec.port, "command": o.spec.command or self.engine.command, "caches": o.caches,
            "extra_args": list(o.spec.extra_args), "timeout_s": o.timeout_s, "phases": list(PHASES),
            "work": str(work) if o.keep_work else None,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "environment": facts.collect(o.spec.python, self.engine.distribution),
            "starts": [], "summary": {},
        }
        for warning in facts.bytecode_missing(self.result["environment"]["engine_bytecode"], self.engine.name):
            logger.warning("%s", warning)
        try:
            for index, step in enumerate(steps, 1):
                record = self._start(index, len(steps), step, work)
                self.result["starts"].append(record)
                self.result["summary"] = stats.summarise(self.result["starts"], o.kinds)
                report.write(self.result, self.path)
        finally:
            if not o.keep_work:
                shutil.rmtree(work, ignore_errors=True)
        return self.result

    def _start(self, index: int, total: int, step: kinds.Step, work: Path) -> dict:
        o = self.options
        name = f"{index:02d}-r{step.round}-{step.kind}" + ("" if step.recorded else "-prep")
        start_dir = work / "starts" / name
        start_dir.mkdir(parents=True)
        record: dict = {"index": index, "kind": step.kind, "round": step.round, "recorded": step.recorded,
                        "why": step.why or None, "log": f"logs/{name}.log", "ok": False, "error": None,
                        "phases": dict.fromkeys(PHASES), "markers": {}, "durations": {}, "foundry": "-",
                        **_critical_fields(None)}
        try:
            archive = self._archive_for(step.kind, work, name)
            plan = kinds.plan(step.kind, o.spec, start_dir, archive, caches=self._caches(work))
        except ValueError as exc:
            record["error"] = str(exc)
            self.progress(f"[{index}/{total}] round {step.round} {step.kind}: not started: {exc}")
            return record
        record.update(command=plan.argv, env=plan.env, archive=str(archive) if archive else None)
        with _emptied(self._caches(work) if step.kind in kinds.COLD_KINDS else None):
            self._run(plan, record)
            if step.kind in kinds.COLD_KINDS:
                # The server has stopped; its cache directories are emptied or removed next.
                record["caches_after"] = caches.inventory(plan.env, caches.carried_paths(archive))
        if step.kind == "save" and record["ok"] and archive is not None and archive.is_dir():
            if self.archive is not None and self.archive != archive:
                shutil.rmtree(self.archive, ignore_errors=True)  # only the latest SAVE's is used
            self.archive = archive
        shutil.rmtree(start_dir, ignore_errors=True)  # cold caches: up to gigabytes each
        self.progress(f"[{index}/{total}] {'' if step.recorded else '(not recorded) '}round {step.round} "
                      f"{step.kind}: {_outcome_line(record)}")
        return record

    def _archive_for(self, kind: str, work: Path, name: str) -> Path | None:
        if kind == "save":
            return work / "archives" / name  # fresh: not there yet
        if kind in kinds.LOAD_KINDS:
            if self.archive is None:
                raise ValueError("no archive to load: no SAVE start has reached ready yet")
            return self.archive
        return None

    def _run(self, plan: kinds.StartPlan, record: dict) -> None:
        o = self.options
        log_path = self.results / record["log"]
        began = time.monotonic()
        try:
            proc = server.ServerProcess(plan.argv, server.environment(plan.env), log_path)
        except OSError as exc:
            record["error"] = f"could not start {plan.argv[0]}: {exc}"
            return
        watch = compilers.CompilerWatch(proc.pgid).start()
        base = f"http://127.0.0.1:{o.spec.port}"
        try:
            client.wait_healthy(base + self.engine.health_path, o.timeout_s, proc.alive, proc.elapsed)
            record["phases"]["health"] = round(proc.elapsed(), 3)
            answer = client.complete(base + self.engine.completion_path, self.engine.completion_body,
                                     o.timeout_s - proc.elapsed())
            record["phases"]["first_completion"] = round(proc.elapsed(), 3)
            record["completion_text"] = client.completion_text(answer)[:200]
            record["ok"] = True
            if record["kind"] == "save" and proc.alive():
                time.sleep(SAVE_SETTLE_S)
                record["settled_s"] = SAVE_SETTLE_S
        except client.StartFailed as exc:
            record["error"] = f"{exc} after {proc.elapsed():.1f} s"
            if not proc.alive():
                record["error"] += f" (exit status {proc.proc.returncode})"
        finally:
            record["stopped_by"] = proc.stop()
            record["compilers"] = watch.stop()
            record["compiler_processes"] = watch.count
            record["port_free"] = server.wait_port_free(o.spec.port, PORT_WAIT_S)
            record["gpu_released"] = server.wait_gpu_released(proc.members, GPU_WAIT_S)
        found = logparse.parse(self.engine, proc.lines)
        record["phases"].update({name: round(t, 3) for name, t in found.phases.items()})
        record.update(markers={name: round(t, 3) for name, t in found.markers.items()}, durations=found.durations,
                      foundry=found.foundry, log_lines=len(proc.lines), wall_s=round(time.monotonic() - began, 3),
                      **_critical_fields(found.critical))
        if o.keep_logs == "tail":
            _keep_tail(log_path, proc.lines, found.matched_lines)


def _critical_fields(critical: critical_path.Combined | None) -> dict:
    """A start's Foundry critical path as its record's fields: ``foundry_critical_s`` (None: no
    process logged one), seconds by item, the overlapped items, and how many lines they came from."""
    if critical is None:
        return {"foundry_critical_s": None, "foundry_critical": {}, "foundry_overlapped": {},
                "foundry_critical_lines": 0}
    return {"foundry_critical_s": critical.total, "foundry_critical": dict(critical.items),
            "foundry_overlapped": dict(critical.overlapped), "foundry_critical_lines": critical.lines}


@contextlib.contextmanager
def _emptied(caches: Path | None):
    """The run's cache directory empty for the block (its directories kept, their contents set
    aside), then as it was: what the cold start compiled is dropped."""
    if caches is None:
        yield
        return
    aside = caches.with_name(caches.name + ".warm")
    os.rename(caches, aside)
    try:
        for sub in aside.iterdir():
            (caches / sub.name).mkdir(parents=True)
        yield
    finally:
        shutil.rmtree(caches, ignore_errors=True)
        os.rename(aside, caches)


def _keep_tail(path: Path, lines: list[logparse.StampedLine], matched: set[int]) -> None:
    """Rewrites the log with only the lines that marked something, those logparse always keeps
    (Foundry's, warnings, tracebacks) and the last TAIL_LINES."""
    kept = {i for i, (_, line) in enumerate(lines) if logparse.always_kept(line)}
    keep = sorted(matched | kept | set(range(max(0, len(lines) - TAIL_LINES), len(lines))))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(logparse.stamp(*lines[i]) + "\n" for i in keep))
    os.replace(tmp, path)


def _outcome_line(record: dict) -> str:
    if not record["ok"]:
        return f"FAILED: {record['error']} (log: {record['log']})"
    p = record["phases"]
    shown = f"/health {p['health']:.1f} s, first completion {p['first_completion']:.1f} s"
    if p.get("engine_init_end") is not None:
        shown = f"engine init end {p['engine_init_end']:.1f} s, " + shown
    if record.get("foundry_critical_s") is not None:
        shown += f", Foundry's critical path {record['foundry_critical_s']:.3f} s"
    return shown + f" (foundry: {record['foundry']})"
