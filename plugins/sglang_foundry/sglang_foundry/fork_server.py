"""SGLang's scheduler and detokenizer forked from a process that has already imported SGLang.

SGLang spawns its children: each execs a fresh interpreter that imports SGLang again before it
does any work (about 30 s for the scheduler on the GPU host, on the critical path of every start).
With Foundry active, a fork server is started at interpreter start-up instead (``start_early``,
run by foundry-core's start-up hook through the ``foundry.early_start`` entry point). It imports
SGLang's scheduler and detokenizer modules (and this plugin's entry point) while the main process imports its own, with the
preload already in place (it is the restarted process's child), and never initialises CUDA. When
SGLang launches its children, each is forked from it (``ForkedProcess``): the imports are done.

A forked child would inherit the fork server's environment, set at start-up, not the one SGLang's
main process has built by the launch (``_set_envs_and_config``, the plugin's own variables). So
each child's target runs under the main process's environment as it was at ``start()``
(``InEnviron``), before anything in the child reads it.

Spawn is kept, with the reason logged once, wherever a fork would not be the same child:

- the fork server initialised CUDA, or started threads, while importing (its status file says so;
  ``fork_server_preload.py`` checks after the imports), or it is not running;
- SGLang runs the child through another executable (its NUMA binding execs ``numactl``);
- the child needs another ``LD_PRELOAD`` than the fork server's (``--enable-memory-saver``).

``FOUNDRY_SGLANG_FORK_SERVER=0`` turns the fork server off (SGLang spawns, as without Foundry).
One difference remains: a forked child's parent process is the fork server, so a child that
signals its parent on a fatal error (SGLang's schedulers send SIGQUIT) ends the fork server, and
the main process learns of the death through its watchdog and the child's pipe instead.
"""

from __future__ import annotations

import contextlib
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

from sglang_foundry.options import env_flag

logger = logging.getLogger("foundry.sglang")

SWITCH_ENV = "FOUNDRY_SGLANG_FORK_SERVER"
STATUS_ENV = "FOUNDRY_SGLANG_FORK_SERVER_STATUS"
PRELOAD_MODULE = "sglang_foundry.fork_server_preload"
# How long a launch waits for the fork server to finish its imports: about what a spawned child
# would spend on the same imports.
STATUS_TIMEOUT_S = 300.0
# The commands that start SGLang's server: ``python -m sglang.launch_server`` and ``sglang serve``.
SERVER_MODULES = ("sglang.launch_server",)


# ---- start-up (the main process, at interpreter start) -----------------------------------


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the fork server is wanted (default yes; ``FOUNDRY_SGLANG_FORK_SERVER=0`` says no)."""
    return env_flag(SWITCH_ENV, True, environ)


def starts_server(orig_argv: Sequence[str]) -> bool:
    """Whether the interpreter's command line starts SGLang's server."""
    args = list(orig_argv[1:])
    for i, arg in enumerate(args):
        if arg == "-m":
            return i + 1 < len(args) and args[i + 1] in SERVER_MODULES
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:] in SERVER_MODULES
        if not arg.startswith("-"):  # a script: the `sglang` console script with `serve`
            return os.path.basename(arg) == "sglang" and i + 1 < len(args) and args[i + 1] == "serve"
    return False


def start_early() -> None:
    """The ``foundry.early_start`` entry point: starts the fork server when this process starts
    SGLang's server with Foundry active (the start-up hook checked that, and the preload) and the
    switch allows it. Never raises: SGLang then spawns, as it does without the fork server."""
    try:
        if not enabled() or not starts_server(getattr(sys, "orig_argv", [])):
            return
        start()
    except Exception as exc:  # noqa: BLE001 - interpreter start-up must go on
        sys.stderr.write(f"foundry: the SGLang fork server did not start ({type(exc).__name__}: {exc}); "
                         "SGLang's children will be spawned\n")


def start(preload: Sequence[str] = (PRELOAD_MODULE,)) -> str:
    """Starts multiprocessing's fork server importing ``preload``; returns its status file."""
    # TMPDIR rather than tempfile: this runs at interpreter start-up, and tempfile imports much.
    status = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"foundry-sglang-fork-server-{os.getpid()}.json")
    if os.path.lexists(status):
        os.unlink(status)
    multiprocessing.set_forkserver_preload(list(preload))
    # Only the fork server gets these: the status file it writes (which also tells the preload
    # module that it runs there); NVML for torch.cuda.is_available(), which SGLang asks at import
    # and which would otherwise initialise the driver; and this process's import path, which
    # multiprocessing passes on but Python 3.12 and older do not apply before the preload, whose
    # ImportError the fork server would swallow (no status: every launch would wait its timeout).
    path = os.pathsep.join(p for p in sys.path if p)
    with _environ({STATUS_ENV: status, "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "PYTHONPATH": path}):
        multiprocessing.forkserver.ensure_running()
    _STATE.started(status, os.environ.get("LD_PRELOAD", ""))
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


# ---- the launch (the main process, when SGLang starts its children) ----------------------


class _State:
    """What the main process knows of its fork server."""

    def __init__(self) -> None:
        self.status_path: str | None = None
        self.ld_preload = ""
        self._status: dict | None = None
        self._said: set[str] = set()

    def started(self, status_path: str, ld_preload: str) -> None:
        self.status_path, self.ld_preload, self._status = status_path, ld_preload, None

    @property
    def running(self) -> bool:
        return self.status_path is not None

    def status(self, timeout_s: float = STATUS_TIMEOUT_S) -> dict:
        """The fork server's own account of its imports, waiting for them to end (a fork would
        wait as long); ``{"safe": False, "why": ...}`` when it cannot be had."""
        if self._status is None:
            if self.status_path is None:
                self._status = {"safe": False, "why": "no fork server was started (see FOUNDRY_SGLANG_FORK_SERVER)"}
            else:
                if os.path.exists(self.status_path):
                    self._status = read_status(self.status_path, timeout_s)
                else:
                    # On the start's critical path (a spawned child would import SGLang for longer);
                    # imported here, not at start-up, where the engine layer would cost the hook.
                    from foundry_core.engine.critical_path import LEDGER

                    logger.info("foundry: waiting for the fork server to finish importing SGLang (at most %.0f s)",
                                timeout_s)
                    with LEDGER.timed("fork server wait"):
                        self._status = read_status(self.status_path, timeout_s)
                with contextlib.suppress(OSError):
                    os.unlink(self.status_path)  # read once; no file per start left in the temporary directory
        return self._status

    def say_forked(self, what: str) -> None:
        if what not in self._said:
            self._said.add(what)
            status = self.status()
            kept = status.get("kept") or []
            logger.info("foundry: SGLang's %s is forked from the fork server (which imported SGLang in %.2f s, "
                        "its checks after the imports included: %.2f s%s)", what, float(status.get("import_s", 0.0)),
                        float(status.get("checks_s", 0.0)),
                        f"; the imports kept the stand-ins for torch's {', '.join(kept)}, which now call torch's own" if kept
                        else "")

    def say_once(self, what: str, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            logger.info("foundry: SGLang's %s is spawned, not forked from the fork server: %s", what, reason)


_STATE = _State()


def read_status(path: str, timeout_s: float, poll_s: float = 0.05) -> dict:
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
            return {"safe": False, "why": "the fork server exited before it finished importing SGLang"}
        if time.monotonic() >= deadline:
            return {"safe": False, "why": f"it had not finished importing SGLang after {timeout_s:.0f} s"}
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
        return f"SGLang starts it through {exe} (its NUMA binding), which only an exec can do"
    if env.get("LD_PRELOAD", "") != state.ld_preload:
        return "it needs another LD_PRELOAD than the fork server's (--enable-memory-saver), which only an exec can load"
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
    def __name__(self) -> str:  # the child tells SGLang's processes apart by its target's name
        return getattr(self.target, "__name__", "")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        os.environ.clear()
        os.environ.update(self.environ)
        return self.target(*args, **kwargs)


class ForkedProcess(multiprocessing.context.ForkServerProcess):
    """``multiprocessing.Process`` for SGLang's launch sites: forked from the fork server when
    :func:`spawn_reason` allows it, else spawned (the reason logged once)."""

    _foundry_forked = False

    def start(self) -> None:
        reason = spawn_reason()
        if reason is None and self._target is not None:
            self._foundry_forked = True
            _STATE.say_forked(_describe(self._target))
            self._target = InEnviron(dict(os.environ), self._target)
        else:
            _STATE.say_once(_describe(self._target), reason or "it has no target to run")
        super().start()

    @staticmethod
    def _Popen(process_obj):
        if process_obj._foundry_forked:
            return multiprocessing.context.ForkServerProcess._Popen(process_obj)
        return multiprocessing.context.SpawnProcess._Popen(process_obj)


def _describe(target: Any) -> str:
    name = getattr(target, "__name__", "")
    return {"run_scheduler_process": "scheduler", "run_detokenizer_process": "detokenizer"}.get(name, name or "child")


class ForkingMultiprocessing:
    """Stands for the ``multiprocessing`` module in SGLang's engine module: ``Process`` is
    :class:`ForkedProcess`; everything else is multiprocessing's own."""

    Process = ForkedProcess

    def __init__(self, module: Any = multiprocessing):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __repr__(self) -> str:
        return f"<sglang-foundry forking view of {self._module!r}>"


def running() -> bool:
    """Whether this process started a fork server (so SGLang's launch sites should fork)."""
    return _STATE.running
