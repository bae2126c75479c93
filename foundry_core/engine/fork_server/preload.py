"""What the fork server (:mod:`foundry_core.engine.fork_server.client`) runs before it forks any child:
:func:`run` imports what the engine's children import (an engine plugin's preload module calls it
with its engine's modules), then writes whether the process is still safe to fork from. Never
raises (multiprocessing's fork server would end on anything but an ImportError, and every launch
would then fail): a failed import or an unsafe state is written to the status file, and the
launches fall back to spawn.

The imports run with torch.cuda's device queries answered from NVML (device_facts.py): SGLang's
kernel package asks the compute capability at import, which would otherwise initialise CUDA. For the
same reason ``torch.cuda.is_available()``, which many modules call at import, counts devices through
NVML there (``PYTORCH_NVML_BASED_CUDA_CHECK=1``, PyTorch's own switch; the CUDA runtime's device count
runs cuInit). Where an import still initialises the driver, the status names it (:class:`DriverWatch`).

Safe means: CUDA was not initialised (the driver cannot be used in a child forked after cuInit; a
driver library that is merely mapped, by an extension linked against it, is fine), and no thread
besides the main one runs (a fork copies only the forking thread, and any lock another thread held
stays locked in the child).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from foundry_core.engine.fork_server import device_facts
from foundry_core.engine.fork_server.client import STATUS_ENV, gc_freeze_wanted

CUDA_ERROR_NOT_INITIALIZED = 3
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
DRIVER_SONAME = "libcuda.so.1"


def mapped_cuda_driver(maps_path: str = "/proc/self/maps") -> str | None:
    """The path of the CUDA driver library if it is mapped into this process, else None."""
    with open(maps_path) as f:
        for line in f:
            path = line.split(None, 5)[-1].strip() if line.count(" ") >= 5 else ""
            if os.path.basename(path).startswith("libcuda.so"):
                return path
    return None


def driver_initialised(path: str) -> bool:
    """Whether cuInit ran in this process, asked of the already-mapped driver without loading or
    initialising anything: before cuInit, cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED.
    (An extension linked against libcuda maps it at import without initialising it.) Raises
    OSError when the driver is not loaded."""
    import ctypes

    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    count = ctypes.c_int()
    return lib.cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED


class DriverProbe:
    """:func:`driver_initialised` by the driver's soname, False while it is not loaded, for checking
    at every import: once the driver is mapped, its ``cuDeviceGetCount`` is looked up once and
    kept (a call then costs under a microsecond instead of the 30 us of a lookup, over the ~10000
    imports of an engine; the 65 us of a failed lookup remain until the driver is mapped)."""

    def __init__(self, soname: str = DRIVER_SONAME):
        self.soname = soname
        self._device_count: Callable[..., int] | None = None

    def __call__(self) -> bool:
        import ctypes

        if self._device_count is None:
            try:
                self._device_count = ctypes.CDLL(self.soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).cuDeviceGetCount
            except OSError:
                return False  # not loaded, so not initialised
        count = ctypes.c_int()
        return self._device_count(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED


def other_threads(shown: int = 5) -> str:
    """The names of the threads running besides the main one (at most ``shown``), "" when none."""
    return ", ".join([t.name for t in threading.enumerate() if t is not threading.main_thread()][:shown])


class DriverInitialised(BaseException):
    """Raised from the import under way when the watch sees the driver initialised: the fork server
    can no longer be forked from, so the rest of the imports would only keep the main process
    waiting for the status. (BaseException: an engine's ``except Exception`` must not swallow it.)"""


class DriverWatch:
    """Finds where the CUDA driver got initialised during the imports. First on ``sys.meta_path``
    for the block, it sees every module import begin (``import`` statements and importlib's alike)
    and finds nothing itself; at each it asks ``initialised`` (a :class:`DriverProbe`), and at the
    first yes keeps what ran since the last no: the driver was initialised after that import began and
    before this one, while the module bodies in :func:`importing_chain` were running (or by another
    thread, which it then names). With ``stop``, it then raises :class:`DriverInitialised`."""

    def __init__(self, initialised: Callable[[], bool] | None = None, stop: bool = False):
        self.initialised = DriverProbe() if initialised is None else initialised
        self.stop = stop
        self.culprit: str | None = None
        self._last: str | None = None
        self.probes = 0  # imports seen, and the seconds their probes took: part of the imports' time
        self.probe_s = 0.0

    def __enter__(self) -> DriverWatch:
        if self.initialised():
            self.culprit = "before the fork server's imports"
        else:
            sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path=None, target=None) -> None:
        # (Not removed from sys.meta_path here: importlib is iterating over it.)
        if self.culprit is None:
            start = time.perf_counter()
            initialised = self.initialised()
            self.probes += 1
            self.probe_s += time.perf_counter() - start
            if initialised:
                since = f"between importing {self._last} and" if self._last else "before"
                self.culprit = f"{since} importing {fullname}, in {importing_chain(sys._getframe(1))}"
                others = other_threads()
                if others:  # then one of them may have done it
                    self.culprit += f" (other threads running: {others})"
                if self.stop:
                    raise DriverInitialised(self.culprit)
            else:
                self._last = fullname
        return None


def importing_chain(frame, limit: int = 6) -> str:
    """``module:line <- module:line ...`` of the module bodies on the stack, innermost first."""
    chain = []
    while frame is not None and len(chain) < limit:
        if frame.f_code.co_name == "<module>":
            name = frame.f_globals.get("__name__", "?")
            chain.append(f"{name}:{frame.f_lineno}")
        frame = frame.f_back
    return " <- ".join(chain) or "an import"


@contextlib.contextmanager
def nvml_device_count() -> Iterator[None]:
    """``torch.cuda.is_available()`` counts devices through NVML for the block (it reads the switch
    at every call), as ``device_count()`` already does; the previous value comes back after."""
    before = os.environ.get(NVML_CHECK_ENV)
    os.environ[NVML_CHECK_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NVML_CHECK_ENV, None)
        else:
            os.environ[NVML_CHECK_ENV] = before


def unsafe_reason(maps_path: str = "/proc/self/maps",
                  initialised: Callable[[str], bool] = driver_initialised) -> str | None:
    """Why forking from this process would not give working children; None when it is safe."""
    try:
        driver = mapped_cuda_driver(maps_path)
        if driver is not None and initialised(driver):
            return f"the imports initialised the CUDA driver ({driver}) in the fork server"
    except Exception as exc:  # noqa: BLE001 - cannot tell: assume the worst
        return f"cannot tell whether CUDA was initialised in the fork server ({type(exc).__name__}: {exc})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the imports initialised CUDA in the fork server"
    others = other_threads()
    if others:
        return f"the imports started threads in the fork server ({others})"
    return None


def write_status(path: str, status: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, path)  # the main process never reads half a file


def nvml_answers() -> contextlib.AbstractContextManager:
    """torch.cuda's device queries answered from NVML (device_facts.py), or nothing changed where
    NVML cannot answer (the imports may then initialise CUDA, and the status says so)."""
    try:
        import pynvml
        import torch

        start = time.perf_counter()
        facts = device_facts.nvml_facts(torch, pynvml)
        return _noting_nvml(device_facts.answered_from(torch, facts), time.perf_counter() - start)
    except Exception:  # noqa: BLE001 - no NVML: import as the engine does
        return contextlib.nullcontext(device_facts.Answers())


@contextlib.contextmanager
def _noting_nvml(answers: contextlib.AbstractContextManager, seconds: float) -> Iterator[device_facts.Answers]:
    with answers as answered:
        answered.nvml_s = seconds
        yield answered


def import_all(modules, answers: Callable[[], contextlib.AbstractContextManager] = nvml_answers,
               watch: Callable[[], DriverWatch] = lambda: DriverWatch(stop=True),
               timings: dict[str, float] | None = None, kept: list[str] | None = None) -> str | None:
    """Imports ``modules`` with the device queries answered from NVML; returns why the process is
    not safe to fork from, or None. Stops at the import that finds the driver initialised.
    ``timings`` gets ``checks_s``: the seconds of the checks after the imports (part of the
    import time the status reports), and each check's own (:data:`CHECKS`), ``nvml_s``: starting
    NVML for the stand-ins (torch's import aside), and ``watch_s`` /
    ``watch_imports``: what the driver watch's probes took during the imports; ``kept`` the queries
    whose stand-in an import kept (each calls torch's own function now)."""
    try:
        with answers() as answered, nvml_device_count(), watch() as watched:
            for name in modules:
                __import__(name)
    except DriverInitialised as found:
        return f"the imports initialised the CUDA driver in the fork server; it happened {found} " \
               "(the fork server stopped importing there)"
    timings = timings if timings is not None else {}
    timings["watch_s"], timings["watch_imports"] = watched.probe_s, watched.probes
    timings["nvml_s"] = getattr(answered, "nvml_s", 0.0)
    with _timed(timings, "checks_s"):
        if kept is not None:
            kept.extend(device_facts.kept_stand_ins(answered))
        return _checked(answered, watched, timings)


# The checks after the imports, each timed in the status: they delay the first fork.
CHECKS = ("answers_s", "process_s")


@contextlib.contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = time.perf_counter() - start


def _checked(answered: device_facts.Answers, watched: DriverWatch, timings: dict[str, float]) -> str | None:
    """After the imports: no stand-in's answer kept (``answers_s``), then :func:`unsafe_reason`
    (``process_s``)."""
    with _timed(timings, "answers_s"):
        holders = device_facts.kept_answers(answered.given)
    if holders:
        return ("the imports kept an answer of the fork server's NVML stand-in for "
                f"torch.cuda.get_device_properties (held by: {', '.join(holders[:5])}), which lacks most of "
                "the device's properties")
    with _timed(timings, "process_s"):
        why = unsafe_reason()
    if why and watched.culprit:
        why += f"; it happened {watched.culprit}"
    return why


def run(modules: Sequence[str], path: str | None = None, before: Callable[[], str] | None = None) -> dict:
    """Imports ``modules``, checks the process, writes the status (to ``path``, default the one
    :func:`~foundry_core.engine.fork_server.client.start` names); returns it. ``before()`` runs
    first (it must start no thread: the checks after the imports would find it) and says what it
    did, kept in the status as ``before``."""
    start = time.perf_counter()
    timings: dict[str, float] = {}
    kept: list[str] = []
    with _timed(timings, "before_s"):
        did = _step(before, "before the imports")
    paused = gc_freeze_wanted(os.environ)
    try:
        with collections_paused(paused):
            why = import_all(modules, timings=timings, kept=kept)
    except BaseException as exc:  # noqa: BLE001 - see the module docstring
        why = f"the imports failed ({type(exc).__name__}: {exc})"
    status = {"safe": why is None, "why": why or "", "import_s": round(time.perf_counter() - start, 3),
              "pid": os.getpid(), "kept": kept, "before": did, "gc_paused": paused,
              **{k: round(v, 3) for k, v in timings.items()}}
    path = path or os.environ.get(STATUS_ENV)
    if path:
        try:
            write_status(path, status)
        except OSError:
            pass  # the main process times out waiting and spawns
    return status


@contextlib.contextmanager
def collections_paused(paused: bool = True) -> Iterator[None]:
    """No garbage collection while the imports run (``paused``), then the heap they made frozen:
    an import makes few cycles, and each full collection walks the whole heap so far (on the H200
    host 1.6 s over SGLang's imports, a few hundred objects found). The children freeze what they
    inherit anyway (:class:`~foundry_core.engine.fork_server.client.InEnviron`)."""
    enabled = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.freeze()
            if enabled:
                gc.enable()


def _step(step: Callable[[], str] | None, when: str) -> str:
    """What ``step()`` says it did; a failure is said, not raised (the imports must go on)."""
    if step is None:
        return ""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001
        return f"the step {when} failed ({type(exc).__name__}: {exc})"


def in_fork_server() -> bool:
    """Whether this process is a fork server (:func:`~foundry_core.engine.fork_server.client.start` sets
    the status variable for that process alone): an engine's preload module runs :func:`run` then."""
    return bool(os.environ.get(STATUS_ENV))
