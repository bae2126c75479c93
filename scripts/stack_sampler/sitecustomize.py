"""Samples the main thread's Python stack of every process that starts with this directory on
PYTHONPATH and FOUNDRY_STACK_SAMPLES=DIR set: ten times a second, one line per sample,
`<unix time>\t<outermost frame>;...;<innermost frame>`, in DIR/stacks-<pid>.txt.

For finding where a start spends seconds that no log line accounts for. Forked children start
their own sampler (threads do not survive fork). A sample is taken when the sampling thread gets
the GIL, so a long C call that holds it shows as a gap in the times, followed by its stack.
Summarise with `python scripts/stack_sampler/summarize.py DIR`. A fork server samples nothing
itself (a thread would make it unsafe to fork from); the children forked from it do.

Every garbage collection of at least FOUNDRY_GC_PAUSE_MS (default 10) milliseconds is written to
DIR/gc-<pid>.txt, `<unix time>\tgen=<generation>\t<seconds>\tcollected=<n>\tfrozen=<n>`: a full
collection holds the GIL (and, in a forked child, copies every page it walks), so it shows as a gap
in the samples with no C call to blame.
"""

import gc
import os
import sys
import threading
import time

_DIR = os.environ.get("FOUNDRY_STACK_SAMPLES")
_INTERVAL = float(os.environ.get("FOUNDRY_STACK_INTERVAL", "0.1"))
_GC_PAUSE_S = float(os.environ.get("FOUNDRY_GC_PAUSE_MS", "10") or 10) / 1e3


def _stack(frame) -> str:
    parts = []
    while frame is not None and len(parts) < 60:
        code = frame.f_code
        parts.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return ";".join(reversed(parts))


def _sample(main_ident: int) -> None:
    path = os.path.join(_DIR, f"stacks-{os.getpid()}.txt")
    with open(path, "a", buffering=1) as out:
        out.write(f"# pid {os.getpid()} argv {' '.join(sys.argv)[:300]}\n")
        while True:
            frame = sys._current_frames().get(main_ident)
            if frame is None:
                return
            line = f"{time.time():.3f}\t{_stack(frame)}\n"
            # Let go of the frame before writing and sleeping: a frame held past its function's
            # return keeps that function's locals (CUDA tensors) alive, which moves later
            # allocations and breaks a LOAD's address checks.
            del frame
            out.write(line)
            time.sleep(_INTERVAL)


_gc_started = 0.0
_gc_file = None  # (pid, file): reopened in a forked child


def _on_gc(phase: str, info: dict) -> None:
    global _gc_started, _gc_file
    if phase == "start":
        _gc_started = time.perf_counter()
        return
    seconds = time.perf_counter() - _gc_started
    if seconds < _GC_PAUSE_S:
        return
    if _gc_file is None or _gc_file[0] != os.getpid():
        _gc_file = (os.getpid(), open(os.path.join(_DIR, f"gc-{os.getpid()}.txt"), "a", buffering=1))
    _gc_file[1].write(f"{time.time() - seconds:.3f}\tgen={info.get('generation')}\t{seconds:.3f}\t"
                      f"collected={info.get('collected')}\tfrozen={gc.get_freeze_count()}\n")


def _start() -> None:
    threading.Thread(target=_sample, args=(threading.main_thread().ident,), daemon=True,
                     name="stack-sampler").start()


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    # A fork server (foundry_core.engine.fork_server) is only forked from while it runs one thread:
    # there only its children sample, or the engine would spawn them instead.
    if not os.environ.get("FOUNDRY_FORK_SERVER_STATUS"):
        _start()
    gc.callbacks.append(_on_gc)  # the fork server's own collections too: its children inherit the callback
    os.register_at_fork(after_in_child=_start)
