"""Restart a Python process that asks for Foundry under libfoundry.so's preload, at interpreter
start-up, before it has imported anything.

Why: the preload must be in a process when it execs. An engine plugin that finds itself in a
process without it can only make the engine *spawn* its GPU processes with the preload set, and a
spawned process imports the engine a second time (about 15 s for vLLM). Restarting the first
process at start-up costs an interpreter start instead, and the engine may then fork.

Installed as ``_foundry_autopreload`` beside ``foundry-autopreload.pth`` in site-packages, which
runs :func:`maybe_reexec` in every interpreter. So this module imports nothing beyond ``os`` and
``sys`` until it has decided to restart, and never raises. It restarts only when all hold:

- the command asks for Foundry: ``--foundry-archive`` on the command line, or ``FOUNDRY_ARCHIVE``
  set, and the mode (``--foundry-mode`` / ``FOUNDRY_MODE``) is not ``off``;
- libfoundry.so is not in ``LD_PRELOAD`` yet, and this is not already a restarted process;
- the command can be replayed (not an interactive session, not a script read from stdin);
- ``FOUNDRY_AUTOPRELOAD`` is not 0/false/no/off (the way to turn this off).

In a process that asks for Foundry and already runs under the preload (the restarted one), it runs
the installed plugins' early starts instead: the entry points of the ``foundry.early_start``
group, each a function of no arguments that decides for itself whether the command is its
engine's and then starts, in the background, what overlaps the engine's own imports (SGLang's
fork server, say). Not in multiprocessing's children, and not with ``FOUNDRY_EARLY_START=0``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence

DISABLE_ENV = "FOUNDRY_AUTOPRELOAD"
EARLY_START_ENV = "FOUNDRY_EARLY_START"
EARLY_START_GROUP = "foundry.early_start"
RESTARTED_ENV = "FOUNDRY_AUTOPRELOAD_RESTARTED"
ARCHIVE_FLAG = "--foundry-archive"
MODE_FLAG = "--foundry-mode"
LIBRARY_NAME = "libfoundry.so"
_FALSE = ("0", "false", "no", "off")


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``; the last one wins), or
    None when absent. A flag without a value counts as present with an empty value."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def wants_foundry(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the command asks for Foundry (an archive, and a mode other than off)."""
    mode = flag_value(argv, MODE_FLAG)
    if mode is None:
        mode = environ.get("FOUNDRY_MODE", "")
    if mode.strip().lower() == "off":
        return False
    return flag_value(argv, ARCHIVE_FLAG) is not None or bool(environ.get("FOUNDRY_ARCHIVE", "").strip())


def preloaded(environ: Mapping[str, str]) -> bool:
    """Whether LD_PRELOAD already names a libfoundry.so."""
    entries = environ.get("LD_PRELOAD", "").replace(":", " ").split()
    return any(os.path.basename(e) == LIBRARY_NAME for e in entries)


def replay_command() -> list[str] | None:
    """This interpreter's command line, to exec again; None when it cannot be replayed."""
    orig = getattr(sys, "orig_argv", None)
    if not orig or not sys.executable or sys.flags.interactive:
        return None
    if not sys.argv or sys.argv[0] in ("", "-"):  # interactive, or a script read from stdin
        return None
    return [sys.executable, *orig[1:]]


def should_restart(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    if environ.get(DISABLE_ENV, "").strip().lower() in _FALSE:
        return False
    if environ.get(RESTARTED_ENV) == "1" or preloaded(environ):
        return False
    return wants_foundry(argv, environ)


def maybe_reexec(execve: Callable[[str, list[str], dict[str, str]], object] = os.execve) -> bool:
    """Replaces this process with the same command under the preload when the module docstring's
    conditions hold; returns False otherwise (and when anything goes wrong: start-up must go on)."""
    try:
        if not should_restart(sys.argv, os.environ):
            return False
        command = replay_command()
        if command is None:
            _say("this command cannot be replayed (interactive, or a script read from stdin)")
            return False
        from foundry_core.preload import preload_environment  # only now: it imports the package

        env = preload_environment(dict(os.environ))
        env[RESTARTED_ENV] = "1"
        sys.stdout.flush()
        sys.stderr.flush()
        execve(command[0], command, env)
        return True  # only reached with a test's execve
    except Exception as exc:  # noqa: BLE001 - never break interpreter start-up; the plugin falls back to spawn
        _say(f"{type(exc).__name__}: {exc}")
        return False


def _say(reason: str) -> None:
    """One line on stderr when a restart was wanted but did not happen (logging is not configured
    this early): the engine plugin then spawns its GPU processes, which is slower."""
    sys.stderr.write(f"foundry: not restarting under the libfoundry.so preload ({reason}); the engine plugin "
                     f"will start its GPU processes with spawn. {DISABLE_ENV}=0 silences this.\n")


def at_startup() -> None:
    """What the .pth file runs in every interpreter."""
    if not maybe_reexec():
        run_early_starts()


def is_multiprocessing_child(argv: Sequence[str]) -> bool:
    """Whether this interpreter is a multiprocessing child (spawn's or the fork server's), which
    runs ``-c`` with the module's bootstrap, or a resource tracker."""
    return bool(argv) and argv[0] == "-c"


def wants_early_starts(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    if environ.get(EARLY_START_ENV, "").strip().lower() in _FALSE:
        return False
    return preloaded(environ) and wants_foundry(argv, environ) and not is_multiprocessing_child(argv)


def run_early_starts(load_entry_points: Callable[[], Sequence[object]] | None = None) -> int:
    """Calls every ``foundry.early_start`` entry point when :func:`wants_early_starts`; returns
    how many ran. Never raises: a failing one is reported on stderr and start-up goes on."""
    try:
        if not wants_early_starts(sys.argv, os.environ):
            return 0
        if load_entry_points is None:
            from importlib.metadata import entry_points  # only now: it costs tens of milliseconds

            eps = list(entry_points(group=EARLY_START_GROUP))
        else:
            eps = list(load_entry_points())
    except Exception as exc:  # noqa: BLE001 - never break interpreter start-up
        sys.stderr.write(f"foundry: early starts skipped ({type(exc).__name__}: {exc})\n")
        return 0
    ran = 0
    for ep in eps:
        try:
            ep.load()()
            ran += 1
        except Exception as exc:  # noqa: BLE001 - one plugin's failure must not stop the others
            sys.stderr.write(f"foundry: early start {getattr(ep, 'name', ep)!s} failed ({type(exc).__name__}: {exc})\n")
    return ran
