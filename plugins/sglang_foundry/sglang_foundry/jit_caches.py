"""What an SGLang scheduler compiles on first use, carried in the archive, so that a LOAD on a new
host (empty caches) answers its first request without compiling.

SGLang 0.5.17's first start compiles, all but the last at the first forward that needs them:

- Triton kernels (the triton attention backend's decode and extend kernels, SGLang's other Triton
  kernels, Triton's launchers, built with gcc) into ``$TRITON_CACHE_DIR`` (default
  ``~/.triton/cache``), one directory per key (a hash of source, compiler and GPU): carried by
  :mod:`foundry_core.engine.triton_cache`, which Triton's cache manager tells each key it opens;
- FlashInfer's JIT modules (the CUDA norm module that ``sgl_kernel``'s rmsnorm hands bf16/fp16 to,
  sampling kernels with ``--sampling-backend flashinfer``, attention kernels with the flashinfer
  backend), built with nvcc and ninja; at another cache path than SAVE's, taken as built by
  :mod:`foundry_core.engine.flashinfer_builds`;
- SGLang's own tvm-ffi JIT kernels (``sglang.kernels.jit``: activation, norms, KV-cache stores);
- Triton's ``cuda_utils``, built with gcc at SGLang's import, before any scheduler: carried by
  :mod:`foundry_core.engine.triton_at_import`, and placed by the fork server before its imports.

FlashInfer's and tvm-ffi's are :mod:`foundry_core.engine.jit_dirs`'s trees (how each loader decides that a cached
build is valid, and so what is carried). Torch Inductor compiles only with
``--enable-torch-compile`` (experimental, ``FOUNDRY_SGLANG_TORCH_COMPILE=1``), and only inside the
decode capture loop, which a LOAD runs without forwards; the Triton kernels it builds there are
carried like SGLang's (a compiled SAVE of the tiny model carried 1408 files, against 91 without).

In the start (the calls are in worker_patches and capture_patches):

- :func:`begin`, at the NCCL seam once the runtime started: Triton's cache opens its directories
  through a carrier (SAVE records them, LOAD fills them from the archive); LOAD starts placing the
  JIT trees and Triton kernels the host lacks on a thread
  (:class:`~foundry_core.engine.cache_carry.CachesAhead`), while SGLang loads the model;
- :func:`placed`, as the capture phase begins: waits for that thread (nothing compiles before the
  first forward, which comes later);
- :func:`carried`, SAVE, after the capture phase (archive saved): carries what the start used,
  then watches the first requests for ``FOUNDRY_SGLANG_CACHE_WATCH`` seconds (default 60, 0: no
  watch; the server's warmup request compiles the prefill kernels) and carries what they add.

``FOUNDRY_HOST_CACHES=0`` turns all of it off.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any
from pathlib import Path

from foundry_core.engine import Mode, flashinfer_builds, host_caches, jit_dirs, triton_at_import
from foundry_core.engine.cache_carry import CacheCarry, CachesAhead, carry_in
from foundry_core.engine.host_caches import HostCaches

from sglang_foundry import runtime

logger = logging.getLogger("foundry.sglang")

__all__ = ["WATCH_ENV", "begin", "carried", "placed", "reset", "watch_seconds"]

WATCH_ENV = "FOUNDRY_SGLANG_CACHE_WATCH"
DEFAULT_WATCH_S = 60.0

_ahead: CachesAhead | None = None  # this process's placement thread (LOAD)
_carry: CacheCarry | None = None  # this process's carry and its watch (SAVE)


def watch_seconds() -> float:
    """How long SAVE watches the first requests for new cache entries (``FOUNDRY_SGLANG_CACHE_WATCH``)."""
    value = os.environ.get(WATCH_ENV, "").strip()
    try:
        return max(float(value), 0.0) if value else DEFAULT_WATCH_S
    except ValueError:
        logger.warning("foundry: %s=%r is not a number of seconds; watching for %.0f s", WATCH_ENV, value,
                       DEFAULT_WATCH_S)
        return DEFAULT_WATCH_S


def _archive_dirs(rt: runtime.SchedulerRuntime) -> tuple[Path, Path] | None:
    archive, rank_dir = rt.session.archive, rt.session.rank_dir
    if archive is None or rank_dir is None or not rt.active or not host_caches.enabled():
        return None
    return Path(archive), Path(rank_dir)


def begin(rt: runtime.SchedulerRuntime) -> None:
    """SAVE and LOAD, before SGLang loads the model: Triton's carrier; LOAD: the placement thread."""
    global _ahead
    start = time.perf_counter()
    where = _archive_dirs(rt)
    if where is None:
        return
    source, carrier = carry_in(*where, load=rt.mode is Mode.LOAD)
    if carrier is not None:
        rt.triton = carrier
    if source is not None:
        # This host's roots (at LOAD nothing is used yet); FlashInfer's at another path than
        # SAVE's is placed if its loader takes the modules as built.
        trees = [flashinfer_builds.relocate(tree, source) for tree in jit_dirs.trees(mapped=())]
        _ahead = CachesAhead(source, trees, logger, setup_s=time.perf_counter() - start, triton=carrier).start()


def placed() -> None:
    """LOAD, before the engine's first forward can look: waits for the placement thread."""
    global _ahead
    if _ahead is not None:
        _ahead.wait()
        _ahead = None


def carried(rt: runtime.SchedulerRuntime) -> CacheCarry | None:
    """SAVE, once the archive is saved: carries the caches the start used, then watches for more
    (see the module). Returns the carry (None when nothing is carried)."""
    global _carry
    where = _archive_dirs(rt)
    if where is None or rt.mode is not Mode.SAVE or not rt.saved:
        return None
    reset()  # one scheduler per process: a new start ends an earlier one's watch (tests)
    _carry = CacheCarry(HostCaches(*where), rt.triton, lambda: _used_trees(rt.triton), logger)
    if _carry.carry() is not None and (seconds := watch_seconds()) > 0:
        _carry.watch(seconds)
    return _carry


def _used_trees(triton: Any) -> list[host_caches.CacheTree]:
    """The JIT trees and Triton's modules built at import (:mod:`~foundry_core.engine.triton_at_import`:
    mapped, but never looked up through the Triton carrier ``triton``), ``used`` from one read of
    this process's mapped files."""
    files = jit_dirs.mapped_files()
    home, looked_up = (triton.home, list(triton.used.values())) if triton is not None else (None, [])
    return [*jit_dirs.trees(mapped=files), triton_at_import.tree(home, mapped=files, looked_up=looked_up)]


def reset() -> None:
    """Forgets this process's placement thread and ends its watch (tests)."""
    global _ahead, _carry
    _ahead = None
    if _carry is not None:
        _carry.stop()
        _carry = None
