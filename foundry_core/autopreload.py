"""Restart a Python process that asks for Foundry under libfoundry.so's preload, at interpreter
start-up, before it has imported anything.

Why: the preload must be in a process when it execs. An engine plugin that finds itself in a
process without it can only make the engine *spawn* its GPU processes with the preload set, and a
spawned process imports the engine a second time (about 15 s for vLLM). Restarting the first
process at start-up costs an interpreter start instead, and the engine may then fork.

Installed as ``_foundry_autopreload`` beside ``foundry-autopreload.pth`` in site-packages, which
runs :func:`at_startup` in every interpreter. So this module imports nothing beyond ``os``,
``sys`` and ``time`` until it has decided to restart, and never raises. It restarts only when all
hold:

- the command asks for Foundry: ``--foundry-archive`` on the command line, or ``FOUNDRY_ARCHIVE``
  set, and the mode (``--foundry-mode`` / ``FOUNDRY_MODE``) is not ``off``;
- libfoundry.so is not in ``LD_PRELOAD`` yet, and this is not already a restarted process;
- the command can be replayed (not an interactive session, not a script read from stdin);
- ``FOUNDRY_AUTOPRELOAD`` is not 0/false/no/off (the way to turn this off);
- no early start hosts the engine's GPU processes (below).

Before it restarts, it runs the installed plugins' early starts: the entry points of the
``foundry.early_start`` group, each a function of no arguments that decides for itself whether the
command is its engine's and then starts, in the background, what overlaps the engine's own imports
(a fork server, say), with libfoundry.so in this process's ``LD_PRELOAD`` for it to inherit. One
that returns True has started what hosts the engine's GPU processes: every one of them is then a
child that execs, or is forked from a process that execs, with the preload from the environment,
and this process, which runs none, is not restarted (an interpreter start saved). One that returns
anything else must have started nothing: the process restarts, and the restarted one does not run
them again (``FOUNDRY_EARLY_STARTS_RAN`` holds its pid; its children run them). A process that
already runs under the preload (``foundry run -- CMD``) runs them at start-up. Not in
multiprocessing's children, and not with ``FOUNDRY_EARLY_START=0``.

What the hook costs the start is kept for :mod:`foundry_core.engine.critical_path` (which this
module cannot import): ``restart``, from the first interpreter's hook, once it found that the
command asks for Foundry (passed as ``FOUNDRY_RESTART_AT``, ``time.time()``, removed from the
environment when read), to the restarted interpreter's hook, and ``early start``, the early starts
with finding them, in a process that is not restarted (less ``engine imports``: the modules of
:data:`ENGINE_MODULES` that finding them imports, which the engine imports anyway).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence

DISABLE_ENV = "FOUNDRY_AUTOPRELOAD"
EARLY_START_ENV = "FOUNDRY_EARLY_START"
EARLY_START_GROUP = "foundry.early_start"
RESTARTED_ENV = "FOUNDRY_AUTOPRELOAD_RESTARTED"
# The pid whose early starts ran before it restarted itself (an exec keeps the pid): that process
# does not run them again; its children, other pids, do.
EARLY_STARTS_RAN_ENV = "FOUNDRY_EARLY_STARTS_RAN"
RESTART_AT_ENV = "FOUNDRY_RESTART_AT"
ARCHIVE_FLAG = "--foundry-archive"
MODE_FLAG = "--foundry-mode"
LIBRARY_NAME = "libfoundry.so"
_FALSE = ("0", "false", "no", "off")

# This interpreter's start-up seconds on the critical path ("restart", "early start"), with the pid
# they belong to (a forked child inherits them); foundry_core.engine.critical_path takes them.
startup_seconds: dict[str, float] = {}
startup_pid: int | None = None
# perf_counter when the early starts began and ended: a plugin imported in between is counted there.
early_start_began: float | None = None
early_start_ended: float | None = None
_at_startup_pid: int | None = None  # the process at_startup ran in (an exec starts this module afresh)
# Standard-library modules that the early starts import and that every engine's first process
# imports anyway before Foundry's plugin could run: torch imports them all (vLLM's, SGLang's and
# TensorRT-LLM's servers import torch at start-up), and vLLM's CLI module imports
# importlib.metadata first. Their time is noted apart from ``early start`` (ENGINE_WORK), as the
# engine's own work done earlier.
ENGINE_MODULES = ("importlib.metadata", "ctypes", "json", "logging", "dataclasses", "pathlib", "multiprocessing")
ENGINE_WORK = "engine imports"


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


def requested(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, str | None]:
    """(mode, archive) the command asks for: each from its flag, else ``FOUNDRY_MODE`` /
    ``FOUNDRY_ARCHIVE``; the mode lower-cased ("" when neither says), the archive None when
    neither names one (a flag without a value names "")."""
    mode = flag_value(argv, MODE_FLAG)
    mode = (mode if mode is not None else environ.get("FOUNDRY_MODE", "")).strip().lower()
    archive = flag_value(argv, ARCHIVE_FLAG)
    if archive is None:
        archive = environ.get("FOUNDRY_ARCHIVE", "").strip() or None
    return mode, archive


def wants_foundry(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the command asks for Foundry (an archive, and a mode other than off)."""
    mode, archive = requested(argv, environ)
    return mode != "off" and archive is not None


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


def maybe_reexec(execve: Callable[[str, list[str], dict[str, str]], object] = os.execve,
                 decided: float | None = None, early_starts_ran: bool = False) -> bool:
    """Replaces this process with the same command under the preload when the module docstring's
    conditions hold; returns False otherwise (and when anything goes wrong: start-up must go on).
    ``decided``: when the hook began to restart (``time.time()``; default now).
    ``early_starts_ran``: the early starts ran here (the restarted process skips them)."""
    try:
        if not should_restart(sys.argv, os.environ):
            return False
        decided = time.time() if decided is None else decided  # the restart costs the start from here
        command = replay_command()
        if command is None:
            _say("this command cannot be replayed (interactive, or a script read from stdin)")
            return False
        from foundry_core.preload import preload_environment  # only now: it imports the package

        env = preload_environment(dict(os.environ))
        env[RESTARTED_ENV] = "1"
        env[RESTART_AT_ENV] = repr(decided)
        if early_starts_ran:
            env[EARLY_STARTS_RAN_ENV] = str(os.getpid())
        sys.stdout.flush()
        sys.stderr.flush()
        execve(command[0], command, env)
        return True  # only reached with a test's execve
    except Exception as exc:  # noqa: BLE001 - never break interpreter start-up; the plugin falls back to spawn
        _say(f"{type(exc).__name__}: {exc}")
        return False


def children_take_the_preload(load_entry_points: Callable[[], Sequence[object]] | None = None) -> bool:
    """In a process that asks for Foundry without the preload: puts libfoundry.so in this
    process's ``LD_PRELOAD`` and runs the early starts (see the module). True when one of them
    started what hosts the engine's GPU processes (the preload stays in the environment for them);
    False otherwise, with ``LD_PRELOAD`` as it was. Never raises. Timed as ``early start``."""
    saved = os.environ.get("LD_PRELOAD")

    def run() -> tuple[int, bool]:
        from foundry_core.preload import preload_environment  # only now: it imports the package

        os.environ["LD_PRELOAD"] = preload_environment(dict(os.environ))["LD_PRELOAD"]
        return _run_early_starts(load_entry_points) if wants_early_starts(sys.argv, os.environ) else (0, False)

    _, hosting = _timed_early_starts(run)
    if not hosting:
        if saved is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = saved
    return hosting


def _timed_early_starts(run: Callable[[], tuple[int, bool]]) -> tuple[int, bool]:
    """``run()`` (the early starts), noted as ``early start`` less the :data:`ENGINE_MODULES`
    imported first; (0, False) when it raises (reported on stderr)."""
    global early_start_began, early_start_ended
    early_start_began, early_start_ended = time.perf_counter(), None
    engine_s = 0.0
    try:
        engine_s = _import_engine_modules()
        return run()
    except Exception as exc:  # noqa: BLE001 - never break interpreter start-up
        sys.stderr.write(f"foundry: early starts skipped ({type(exc).__name__}: {exc})\n")
        return 0, False
    finally:
        early_start_ended = time.perf_counter()
        _note("early start", early_start_ended - early_start_began - engine_s)


def _import_engine_modules() -> float:
    """Imports :data:`ENGINE_MODULES` that this process has not imported yet, noting their time
    as ``engine imports`` (the engine's own work, done earlier: not in the critical-path total);
    returns it."""
    began = time.perf_counter()
    for name in ENGINE_MODULES:
        if name not in sys.modules:
            __import__(name)
    seconds = time.perf_counter() - began
    _note(ENGINE_WORK, seconds)
    return seconds


def _say(reason: str) -> None:
    """One line on stderr when a restart was wanted but did not happen (logging is not configured
    this early): the engine plugin then spawns its GPU processes, which is slower."""
    sys.stderr.write(f"foundry: not restarting under the libfoundry.so preload ({reason}); the engine plugin "
                     f"will start its GPU processes with spawn. {DISABLE_ENV}=0 silences this.\n")


def at_startup() -> None:
    """What the .pth file runs in every interpreter, once (``site`` may read a site-packages
    directory's .pth files twice, as a virtual environment's start-up can)."""
    global _at_startup_pid
    if _at_startup_pid == os.getpid():
        return
    _at_startup_pid = os.getpid()
    began = time.time()
    try:
        restart = should_restart(sys.argv, os.environ)
    except Exception:  # noqa: BLE001 - never break interpreter start-up
        restart = False
    if restart:
        if not children_take_the_preload():
            maybe_reexec(decided=began, early_starts_ran=True)
        return
    note_restart()
    run_early_starts()


def _note(item: str, seconds: float) -> None:
    global startup_pid
    if startup_pid != os.getpid():
        startup_seconds.clear()
        startup_pid = os.getpid()
    startup_seconds[item] = startup_seconds.get(item, 0.0) + seconds


def note_restart(environ: MutableMapping[str, str] | None = None,
                 now: Callable[[], float] = time.time) -> float | None:
    """In a restarted interpreter: the seconds since the first one decided to restart
    (``FOUNDRY_RESTART_AT`` in ``environ``, default os.environ, removed there so that no child
    reads it again), noted as ``restart``; None when the variable is absent or unusable."""
    value = (os.environ if environ is None else environ).pop(RESTART_AT_ENV, None)
    if value is None:
        return None
    try:
        seconds = now() - float(value)
    except ValueError:
        return None
    if not 0.0 <= seconds < 3600.0:  # the wall clock moved meanwhile: no measurement
        return None
    _note("restart", seconds)
    return seconds


def is_multiprocessing_child(argv: Sequence[str]) -> bool:
    """Whether this interpreter is a multiprocessing child (spawn's or the fork server's), which
    runs ``-c`` with the module's bootstrap, or a resource tracker."""
    return bool(argv) and argv[0] == "-c"


def wants_early_starts(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether this interpreter runs the early starts: Foundry asked for, libfoundry.so in the
    environment's ``LD_PRELOAD``, not a multiprocessing child, not a process that ran them before
    it restarted itself, not turned off."""
    if environ.get(EARLY_START_ENV, "").strip().lower() in _FALSE \
            or environ.get(EARLY_STARTS_RAN_ENV) == str(os.getpid()):
        return False
    return preloaded(environ) and wants_foundry(argv, environ) and not is_multiprocessing_child(argv)


def run_early_starts(load_entry_points: Callable[[], Sequence[object]] | None = None) -> tuple[int, bool]:
    """Calls every ``foundry.early_start`` entry point when :func:`wants_early_starts`; returns
    how many ran and whether one of them returned True (it started what hosts the engine's GPU
    processes). Never raises: a failing one is reported on stderr and start-up goes on. Their
    time (finding them included) is noted as ``early start``."""
    try:
        if not wants_early_starts(sys.argv, os.environ):
            return 0, False
    except Exception as exc:  # noqa: BLE001 - never break interpreter start-up
        sys.stderr.write(f"foundry: early starts skipped ({type(exc).__name__}: {exc})\n")
        return 0, False
    return _timed_early_starts(lambda: _run_early_starts(load_entry_points))


def _run_early_starts(load_entry_points: Callable[[], Sequence[object]] | None) -> tuple[int, bool]:
    try:
        if load_entry_points is None:
            from importlib.metadata import entry_points  # only now: it costs tens of milliseconds

            eps = list(entry_points(group=EARLY_START_GROUP))
        else:
            eps = list(load_entry_points())
    except Exception as exc:  # noqa: BLE001 - never break interpreter start-up
        sys.stderr.write(f"foundry: early starts skipped ({type(exc).__name__}: {exc})\n")
        return 0, False
    ran, hosting = 0, False
    for ep in eps:
        try:
            hosting = ep.load()() is True or hosting
            ran += 1
        except Exception as exc:  # noqa: BLE001 - one plugin's failure must not stop the others
            sys.stderr.write(f"foundry: early start {getattr(ep, 'name', ep)!s} failed ({type(exc).__name__}: {exc})\n")
    return ran, hosting
