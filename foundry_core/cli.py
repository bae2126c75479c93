"""The `foundry` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from foundry_core import __version__


def _cmd_run(args: argparse.Namespace) -> int:
    from foundry_core.preload import preload_environment

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("foundry run: give the command to run after --, e.g. `foundry run -- python serve.py`", file=sys.stderr)
        return 2
    env = preload_environment()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"foundry run: command not found: {command[0]}", file=sys.stderr)
        return 127
    return 0  # not reached


def _cmd_preload_path(args: argparse.Namespace) -> int:
    from foundry_core.preload import preload_path

    print(preload_path())
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from foundry_core.doctor import run_checks

    checks = run_checks()
    table = Table(title="foundry doctor")
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail")
    for c in checks:
        table.add_row(c.name, "[green]ok[/green]" if c.ok else "[yellow]no[/yellow]", c.detail)
    Console().print(table)
    # Missing GPU or preload is information, not failure; a missing library is.
    return 0 if checks and checks[0].ok else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from foundry_core.demo import main as demo_main

    return demo_main(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from foundry_core.demo import bench

    return bench(args)


def _console():
    from rich.console import Console

    return Console()


def _cmd_inspect(args: argparse.Namespace) -> int:
    import json

    from foundry_core import inspect
    from foundry_core.errors import FoundryError

    try:
        if args.graph is None:
            summary = inspect.summarize(args.archive)
            if args.json:
                print(json.dumps(summary, indent=1))
            else:
                inspect.render_summary(summary, _console())
            return 0
        details = []
        for view in inspect.open_views(args.archive):
            details.append(inspect.graph_detail(view, inspect.resolve_graph_index(view.payload, args.graph)))
    except FoundryError as exc:
        print(f"foundry inspect: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(details if len(details) > 1 else details[0], indent=1))
    else:
        for d in details:
            inspect.render_graph(d, _console())
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from foundry_core.verify import render_checks, verify_archive

    checks = verify_archive(args.archive)
    render_checks(checks, _console())
    failed = [c for c in checks if not c.passed]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed" + (f", {len(failed)} failed" if failed else ""))
    return 1 if failed else 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from foundry_core.diff import diff_archives, render_diff
    from foundry_core.errors import FoundryError

    try:
        diffs = diff_archives(args.a, args.b)
    except FoundryError as exc:
        print(f"foundry diff: {exc}", file=sys.stderr)
        return 2
    render_diff(diffs, args.a, args.b, _console())
    return 1 if diffs else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foundry", description="Persist CUDA graphs and restore them in a fresh process.")
    parser.add_argument("--version", action="version", version=f"foundry {__version__}")
    parser.add_argument("--log", choices=["debug", "info", "warning", "error"], default=None,
                        help="log level (also FOUNDRY_LOG)")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", help="run a command with libfoundry.so preloaded", description=(
        "Runs CMD with libfoundry.so in LD_PRELOAD so that its CUDA allocations and kernel loads are seen. "
        "Example: foundry run -- python train.py"))
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("preload-path", help="print the path of libfoundry.so for LD_PRELOAD")
    p.set_defaults(func=_cmd_preload_path)

    p = sub.add_parser("doctor", help="check the driver, the GPU, the preload and the default region")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("demo", help="SAVE then LOAD decode graphs of the built-in model and compare")
    p.set_defaults(func=_cmd_demo)

    from foundry_core.demo import add_bench_arguments

    p = sub.add_parser("bench", help="measure capture vs restore, replay latency and archive size",
                       description="SAVE decode graphs of the built-in model in one process, LOAD them in fresh "
                                   "processes once per instantiation mode, and report times, latency and sizes.")
    add_bench_arguments(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("inspect", help="summarise an archive, or print one of its graphs",
                       description="Summarises an archive (fingerprint, ranks, graphs, groups, nodes, kernels, images, "
                                   "region, sizes); no GPU needed.")
    p.add_argument("archive", help="archive directory")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--graph", metavar="N", help="print graph N (index or name) in full")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("verify", help="check an archive's structure, checksums, fingerprint and references",
                       description="Checks an archive; exits 0 when every check passes, 1 otherwise. The fingerprint "
                                   "check is skipped on machines without a GPU.")
    p.add_argument("archive", help="archive directory")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("diff", help="compare two archives",
                       description="Compares two archives; exits 0 when identical, 1 when different, 2 on errors.")
    p.add_argument("a", metavar="A", help="first archive directory")
    p.add_argument("b", metavar="B", help="second archive directory")
    p.set_defaults(func=_cmd_diff)

    from foundry_core.ready.cli import add_ready_parser  # argparse only; the measurement loads when it runs

    add_ready_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = args.log or os.environ.get("FOUNDRY_LOG", "warning")
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
