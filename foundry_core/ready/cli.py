"""`foundry ready`: measure time to ready (``foundry ready vllm|sglang MODEL ...``) or print and
draw a recorded result again (``foundry ready report RESULT.json``).

Only argparse and the small tables of engines and kinds are imported here: the measurement, rich
and matplotlib load when the command runs, so that `foundry --help` stays fast.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from foundry_core.ready.engines import ENGINES
from foundry_core.ready.kinds import KINDS


class _EngineArgsParser(argparse.ArgumentParser):
    """Everything after the first ``--`` goes to the engine (``engine_args``) unparsed: argparse
    alone would not take positionals after ``--`` once options came between them and the model."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        tail: list[str] = []
        if "--" in args:
            at = args.index("--")
            args, tail = args[:at], args[at + 1:]
        namespace, rest = super().parse_known_args(args, namespace)
        namespace.engine_args = tail
        return namespace, rest


def add_ready_parser(sub: argparse._SubParsersAction) -> None:
    """Adds `ready` and its commands to the `foundry` parser's sub-commands."""
    ready = sub.add_parser("ready", help="measure an engine's time to ready: unmodified, SAVE and LOAD starts",
                           description=__doc__.split("\n\n")[0].replace("`foundry ready`: ", ""))
    commands = ready.add_subparsers(dest="ready_cmd", metavar="ENGINE|report", parser_class=_EngineArgsParser)
    commands.required = True
    for name in ENGINES:
        p = commands.add_parser(name, help=f"start {name}'s server in rounds of each kind and time it",
                                usage=f"foundry ready {name} MODEL [options] [-- ENGINE ARGS...]",
                                description=f"Starts {name}'s server N times per kind, one of each kind per round, "
                                            "and times each start from exec to its first completion. Arguments "
                                            "after -- go to every start.")
        _add_run_arguments(p)
        p.set_defaults(func=_cmd_run, engine=name)
    p = commands.add_parser("report", help="print the tables and draw the chart of a recorded result",
                            description="Prints the tables of a result file and draws its chart again.")
    p.add_argument("result", type=Path, help="a ready-ENGINE.json written by `foundry ready ENGINE`")
    p.add_argument("--png", type=Path, default=None, help="where to draw the chart (default: beside the JSON)")
    p.set_defaults(func=_cmd_report)


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="the model: a directory (made absolute) or a name the engine resolves")
    p.add_argument("--rounds", type=int, default=3, help="starts per kind (default 3)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"comma-separated kinds, run in this order each round (default {','.join(KINDS)})")
    p.add_argument("--results", type=Path, default=Path("ready-results"),
                   help="directory for the JSON, the chart and each start's log (default ./ready-results)")
    p.add_argument("--python", default=sys.executable, help="the Python that runs the engine (default: this one)")
    p.add_argument("--command", default=None,
                   help="the server command template instead of the engine's, with {python} and {model}, e.g. "
                        "'{python} -m sglang.launch_server --model-path {model}'; --host/--port are appended")
    p.add_argument("--engine-args", dest="engine_args_text", default="",
                   help="arguments for every start as one string (shell-split), before those after --")
    p.add_argument("--port", type=int, default=30711, help="the server's port (default 30711)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds a start may take to its first completion (default 900)")
    p.add_argument("--keep-logs", choices=("all", "tail"), default="all",
                   help="each start's whole log, or only its marker lines, Foundry's lines, warnings and "
                        "the last 200 lines")
    p.add_argument("--warm-up", choices=("auto", "always", "never"), default="auto",
                   help="an unrecorded unmodified start first: when the engine's caches are empty (auto)")
    p.add_argument("--work", type=Path, default=None,
                   help="where the run's directory for archives and cold caches goes (default: the system's temporary "
                        "directory); it is removed at the end")
    p.add_argument("--keep-work", action="store_true", help="keep the work directory (the last archive)")
    p.add_argument("--caches", choices=("run", "host"), default="run",
                   help="run: every start's compile caches in the run's own directory, emptied for each cold start "
                        "(a new host with the same image and paths); host: warm starts use this host's caches, "
                        "cold ones a fresh directory each (a new host whose paths differ)")
    p.add_argument("--no-chart", action="store_true", help="do not draw the PNG")


def _model_path(model: str) -> str:
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def _console():
    from rich.console import Console

    return Console()


def _draw(result: dict, png: Path, console) -> None:
    from foundry_core.ready import chart

    try:
        console.print(f"chart: {chart.draw(result, png)}")
    except chart.MatplotlibMissing as exc:
        console.print(f"[yellow]{exc}[/yellow]")


def _cmd_run(args: argparse.Namespace) -> int:
    from foundry_core.ready import engines, harness, kinds, report

    console = _console()
    extra = (*shlex.split(args.engine_args_text), *args.engine_args)
    try:
        spec = kinds.ServerSpec(engines.engine(args.engine), _model_path(args.model), args.python, extra,
                                args.port, args.command)
        spec.argv()  # a bad template is an error before anything starts
        options = harness.Options(spec, tuple(k.strip() for k in args.kinds.split(",") if k.strip()), args.rounds,
                                  args.results, args.timeout, args.keep_logs, args.warm_up, args.work,
                                  args.keep_work, args.caches)
        run = harness.Run(options, progress=console.print)
        result = run.execute()  # bad kinds or rounds are refused before anything starts
    except ValueError as exc:
        print(f"foundry ready: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the results or work directory: not writable, or full
        print(f"foundry ready: {exc}; check that --results and --work can be written and have room",
              file=sys.stderr)
        return 2
    report.print_result(result, console)
    console.print(f"result: {run.path}")
    if not args.no_chart:
        _draw(result, run.path.with_suffix(".png"), console)
    return 1 if report.failures(result) else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from foundry_core.ready import report

    console = _console()
    try:
        result = report.read(args.result)
    except ValueError as exc:
        print(f"foundry ready report: {exc}", file=sys.stderr)
        return 2
    report.print_result(result, console)
    _draw(result, args.png or args.result.with_suffix(".png"), console)
    return 0
