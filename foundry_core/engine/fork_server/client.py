"""An engine's child processes forked from a process that has already imported the engine.

An engine that spawns its GPU processes (SGLang's scheduler, vLLM's engine core) has each child
exec a fresh interpreter that imports the engine again before it does any work (10-30 s on the
GPU host, on the critical path of every start). With Foundry active, the engine plugin's early
start (run by the start-up hook through the ``foundry.early_start`` entry points) calls
:func:`start` instead: multiprocessing's fork server imports the engine's child modules (the
plugin's preload module, which runs :mod:`foundry_core.engine.fork_server.preload`) while the main process
imports its own, with the preload already in place (the start-up hook put libfoundry.so in the
main process's ``LD_PRELOAD`` for it, and does not restart the main process, which runs no GPU
work), and never initialises CUDA. When the engine starts a child through :class:`ForkingMultiprocessing` (the
plugin puts it where the engine looks up ``multiprocessing`` at its launch sites), the child is
forked from that server: the imports are done.

A forked child would inherit the fork server's environment, set at start-up, not the one the main
process has built by the launch (the engine's and the plugin's variables). So each child's target
runs under the main process's environment as it was at ``start()`` (:class:`InEnviron`), before
anything in the child reads it.

A forked child also starts with the fork server's whole import heap (torch, Triton and transformers
alone make 0.44 million objects). Its garbage collector would walk all of it at every full
collection, and the start waits for each one, whatever the child is doing at that moment. Such a collection is the likely cause, not yet shown,
of a 0.6 s stall inside a tiny model's LOAD on the H200. So the child freezes that heap before its
target runs (``gc.freeze()``). CPython's documentation gives the same call for children forked
without exec, made in the parent just before the fork; vLLM's engine core freezes its heap after
its start-up. Frozen objects are left out of collections, and their pages stay shared with the
fork server. Objects the child makes are collected as usual. An engine that thaws the heap itself
ends it: SGLang's capture loop (``freeze_gc``) unfreezes and collects everything when it ends,
which a LOAD skips and a SAVE or a fallback runs. The fork server itself does not collect while
it imports (:func:`~foundry_core.engine.fork_server.preload.run`): on the H200 host its full
collections over SGLang's imports took 1.6 s of them and found a few hundred objects. Nor does the
main process, from the early start to the engine's first launch (:mod:`.main_gc`).
``FOUNDRY_FORK_GC_FREEZE=0`` (or false, no, off) turns all three off.

The child's first write to each page it inherited costs a page fault and a copy, which a spawned
child, whose heap is its own, never pays: its early requests would. With
``FOUNDRY_FORK_PRIVATE_HEAP=1`` the child has the kernel copy those pages on a thread while it
starts the engine (:mod:`.private_heap`; off by default until a GPU run has measured it).

Spawn is kept, with the reason logged once, wherever a fork would not be the same child
(:func:`spawn_reason`):

- the fork server initialised CUDA, or started threads, while importing (its status file says so),
  or it is not running;
- the engine runs the child through another executable (a NUMA binding that execs ``numactl``);
- the child needs another ``LD_PRELOAD`` than the fork server's (SGLang's ``--enable-memory-saver``).

One difference remains: a forked child's parent process is the fork server, so a child that
signals its parent on a fatal error (SGLang's schedulers send SIGQUIT) ends the fork server, and the
main process learns of the death through the engine's watchdog and the child's pipe instead.

This module imports only the standard library: the early start runs it at interpreter start-up.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.spawn
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from foundry_core.engine.fork_server import main_gc

logger = logging.getLogger("foundry.fork_server")

# Only the fork server has it: the status file it writes after its imports.
STATUS_ENV = "FOUNDRY_FORK_SERVER_STATUS"
# How long a launch waits for the fork server to finish its imports: about what a spawned child
# would spend on the same imports.
STATUS_TIMEOUT_S = 300.0
# Off (OFF_WORDS, as the engine options read them): the fork server collects during its imports
# as usual, and a forked child leaves the heap it inherits to its garbage collector.
GC_FREEZE_ENV = "FOUNDRY_FORK_GC_FREEZE"
OFF_WORDS = ("0", "false", "no", "off")


def gc_freeze_wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` leaves :data:`GC_FREEZE_ENV` on (the default)."""
    return environ.get(GC_FREEZE_ENV, "1").strip().lower() not in OFF_WORDS


# ---- start-up (the main process, at interpreter start) -----------------------------------


def start_early(engine: str, wanted: Callable[[], bool], start_server: Callable[[], object], children: str) -> bool:
    """An engine plugin's ``foundry.early_start``: ``start_server()`` when ``wanted()`` (this
    command starts the engine's server, whose GPU processes are all children, and the plugin's
    switch allows it). True when the fork server started: the start-up hook then leaves the main
    process without the preload (:mod:`foundry_core.autopreload`). Never raises: on any error it
    says so on stderr and returns False, and the engine spawns ``children`` as it does without a
    fork server."""
    try:
        if not wanted():
            return False
        start_server()
    except Exception as exc:  # noqa: BLE001 - interpreter start-up must go on
        sys.stderr.write(f"foundry: the {engine} fork server did not start ({type(exc).__name__}: {exc}); "
                         f"{children} will be spawned\n")
        return False
    if gc_freeze_wanted(os.environ):
        try:
            main_gc.pause()  # this process now imports the engine; resumed at its first launch
        except Exception as exc:  # noqa: BLE001 - the imports then run with collections, as without Foundry
            sys.stderr.write(f"foundry: collections not paused over the engine's imports ({type(exc).__name__}: "
                             f"{exc})\n")
    return True


def start(preload: Sequence[str], engine: str, child_names: Mapping[str, str] | None = None,
          environ: Mapping[str, str] | None = None) -> str:
    """Starts multiprocessing's fork server importing the modules ``preload`` (the engine plugin's
    preload module); returns its status file. ``engine`` names the engine in the log;
    ``child_names`` maps a child's target function name to what the log calls it; ``environ``:
    variables for the fork server alone (its children run under the main process's)."""
    # TMPDIR rather than tempfile: this runs at interpreter start-up, and tempfile imports much.
    status = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"foundry-fork-server-{os.getpid()}.json")
    if os.path.lexists(status):
        os.unlink(status)
    multiprocessing.set_forkserver_preload(list(preload))
    # Only the fork server gets these: the status file it writes (which also tells the preload
    # module that it runs there); NVML for torch.cuda.is_available(), which engines ask at import
    # and which would otherwise initialise the driver; and this process's import path, which
    # multiprocessing passes on but Python 3.12 and older do not apply before the preload, whose
    # ImportError the fork server would swallow (no status: every launch would wait its timeout).
    path = os.pathsep.join(p for p in sys.path if p)
    with _environ({**(environ or {}), STATUS_ENV: status, "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "PYTHONPATH": path}):
        multiprocessing.forkserver.ensure_running()
    _STATE.started(status, os.environ.get("LD_PRELOAD", ""), engine, dict(child_names or {}))
    return status


@contextlib.contextmanager
def _environ(values: Mapping[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- the launch (the main process, when the engine starts its children) -------------------


class _State:
    """What the main process knows of its fork server."""

    def __init__(self) -> None:
        self.status_path: str | None = None
        self.ld_preload = ""
        self.engine = "the engine"
        self.child_names: dict[str, str] = {}
        self._status: dict | None = None
        self._said: set[str] = set()

    def started(self, status_path: str, ld_preload: str, engine: str, child_names: dict[str, str]) -> None:
        self.status_path, self.ld_preload, self._status = status_path, ld_preload, None
        self.engine, self.child_names = engine, child_names

    @property
    def running(self) -> bool:
        return self.status_path is not None

    def status(self, timeout_s: float = STATUS_TIMEOUT_S) -> dict:
        """The fork server's own account of its imports, waiting for them to end (a fork would
        wait as long); ``{"safe": False, "why": ...}`` when it cannot be had."""
        if self._status is None:
            if self.status_path is None:
                self._status = {"safe": False, "why": "no fork server was started"}
            else:
                if os.path.exists(self.status_path):
                    self._status = read_status(self.status_path, timeout_s, self.engine)
                else:
                    # The engine's imports, which a spawned child would run for longer after this
                    # point: beside the critical path, but for the fork server's own steps (its
                    # placement before the imports, its driver watch, its checks), which are on it.
                    # Imported here, not at start-up, where the engine layer would cost the hook.
                    from foundry_core.engine.critical_path import LEDGER

                    logger.info("foundry: waiting for the fork server to finish importing %s (at most %.0f s)",
                                self.engine, timeout_s)
                    with LEDGER.engine_work(WAIT_ITEM):
                        self._status = read_status(self.status_path, timeout_s, self.engine)
                    LEDGER.count_part(WAIT_ITEM, OWN_ITEM, own_seconds(self._status))
                with contextlib.suppress(OSError):
                    os.unlink(self.status_path)  # read once; no file per start left in the temporary directory
        return self._status

    def describe(self, target: Any) -> str:
        name = getattr(target, "__name__", "")
        return self.child_names.get(name, name or "child")

    def say_forked(self, what: str) -> None:
        if what not in self._said:
            self._said.add(what)
            status = self.status()
            kept = status.get("kept") or []
            logger.info("foundry: %s's %s is forked from the fork server (which imported %s in %.2f s, "
                        "its checks after the imports included: %.2f s, its driver watch over %d imports: %.2f s%s)",
                        self.engine, what, self.engine, float(status.get("import_s", 0.0)),
                        float(status.get("checks_s", 0.0)), int(status.get("watch_imports", 0)),
                        float(status.get("watch_s", 0.0)),
                        f"; the imports kept the stand-ins for torch's {', '.join(kept)}, which now call torch's own" if kept
                        else "")
            if status.get("before") and "before" not in self._said:
                self._said.add("before")
                logger.info("foundry: the fork server, before importing %s: %s", self.engine, status["before"])

    def say_once(self, what: str, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            logger.info("foundry: %s's %s is spawned, not forked from the fork server: %s", self.engine, what, reason)


_STATE = _State()

# The critical-path items of a wait for the fork server (critical_path.py).
WAIT_ITEM = "fork server imports"
OWN_ITEM = "fork server own"
# The fork server's own steps inside its import time, from its status (preload.run).
OWN_STEPS = ("before_s", "nvml_s", "watch_s", "checks_s")


def own_seconds(status: dict) -> float:
    """Foundry's seconds inside the fork server's import time: the step before the imports,
    starting NVML, the driver watch and the checks after the imports (the rest is the engine's
    imports)."""
    total = 0.0
    for key in OWN_STEPS:
        try:
            total += max(float(status.get(key, 0.0)), 0.0)
        except (TypeError, ValueError):
            continue
    return total


def read_status(path: str, timeout_s: float, engine: str = "the engine", poll_s: float = 0.05) -> dict:
    """The status file the fork server writes after its imports, waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path) as f:
                status = json.load(f)
            if isinstance(status, dict) and isinstance(status.get("safe"), bool):
                return status
            return {"safe": False, "why": f"its status file {path} is malformed"}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            return {"safe": False, "why": f"its status file {path} is unreadable ({exc})"}
        if not _server_alive():
            return {"safe": False, "why": f"the fork server exited before it finished importing {engine}"}
        if time.monotonic() >= deadline:
            return {"safe": False, "why": f"it had not finished importing {engine} after {timeout_s:.0f} s"}
        time.sleep(poll_s)


def _server_alive() -> bool:
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def spawn_reason(state: _State = _STATE, environ: Mapping[str, str] | None = None,
                 executable: str | None = None) -> str | None:
    """Why the child about to start must be spawned; None when it may be forked."""
    env = os.environ if environ is None else environ
    # multiprocessing keeps the executable as bytes on some versions (3.11).
    exe = os.fsdecode(multiprocessing.spawn.get_executable() if executable is None else executable)
    if not state.running:
        return "no fork server is running"
    if os.path.realpath(exe) != os.path.realpath(sys.executable):
        return f"{state.engine} starts it through {exe} (a NUMA binding), which only an exec can do"
    if env.get("LD_PRELOAD", "") != state.ld_preload:
        return ("it needs another LD_PRELOAD than the fork server's (SGLang's --enable-memory-saver, say), "
                "which only an exec can load")
    status = state.status()
    if not status["safe"]:
        return f"the fork server is not safe to fork from: {status.get('why', 'no reason given')}"
    return None


@dataclass(frozen=True)
class InEnviron:
    """A process target that first takes on ``environ`` (the main process's environment at the
    child's start), then runs ``target``."""

    environ: dict[str, str]
    target: Callable[..., Any]

    @property
    def __name__(self) -> str:  # an engine may tell its processes apart by its target's name
        return getattr(self.target, "__name__", "")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        os.environ.clear()
        os.environ.update(self.environ)
        if gc_freeze_wanted(self.environ):
            gc.freeze()  # the inherited import heap: see the module
        from foundry_core.engine.fork_server import private_heap  # here: not at interpreter start-up

        if private_heap.wanted(self.environ):
            private_heap.start()  # that heap's pages copied up front, on a thread
        return self.target(*args, **kwargs)


class ForkedProcess(multiprocessing.context.ForkServerProcess):
    """``multiprocessing.Process`` for an engine's launch sites: forked from the fork server when
    :func:`spawn_reason` allows it, else spawned (the reason logged once)."""

    _foundry_forked = False

    def start(self) -> None:
        what = _STATE.describe(self._target)
        main_gc.resume(f"{what} launched")  # the engine's imports are done
        reason = spawn_reason()
        if reason is None and self._target is not None:
            self._foundry_forked = True
            _STATE.say_forked(what)
            self._target = InEnviron(dict(os.environ), self._target)
        else:
            _STATE.say_once(what, reason or "it has no target to run")
        super().start()

    @staticmethod
    def _Popen(process_obj):
        if process_obj._foundry_forked:
            return multiprocessing.context.ForkServerProcess._Popen(process_obj)
        return multiprocessing.context.SpawnProcess._Popen(process_obj)


class ForkingMultiprocessing:
    """Stands for the ``multiprocessing`` module (or one of its contexts) where an engine's launch
    site looks it up: ``Process`` is :class:`ForkedProcess`; everything else is the module's own."""

    Process = ForkedProcess

    def __init__(self, module: Any = multiprocessing):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __repr__(self) -> str:
        return f"<foundry forking view of {self._module!r}>"


def running() -> bool:
    """Whether this process started a fork server (so the engine's launch sites should fork)."""
    return _STATE.running
