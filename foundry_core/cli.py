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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = args.log or os.environ.get("FOUNDRY_LOG", "warning")
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
