"""JIT module caches that a loader checks by path, as carried cache trees: FlashInfer's and
tvm-ffi's build directories (:class:`~foundry_core.engine.host_caches.CacheTree`).

How each loader decides that a cached build is valid (FlashInfer 0.6.15, apache-tvm-ffi 0.1.11,
SGLang 0.5.17), and so what is carried:

- **FlashInfer** (``flashinfer/jit/core.py`` ``JitSpec.build_and_load``) keeps a module in
  ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>/cached_ops/<name>/`` (the base
  defaults to the home directory). Unless the module is AOT-built, every first use writes
  ``build.ninja`` there (only when its content changed) and runs ``ninja``, which rebuilds unless
  ``.ninja_log`` has each output's command and time, ``.ninja_deps`` its headers, and every output
  is not older than its inputs; then it loads ``<name>.so``. Generated sources (attention modules)
  sit in ``.../generated/<name>/`` and are inputs too. So a module's two directories are carried
  whole, with each file's modification time, and placed with it; and since ninja's records name
  absolute paths, only where FlashInfer's cache is at the saving host's path (the same image and
  user). FlashInfer or CUDA files on the loading host newer than the SAVE's build make ninja
  rebuild, as it would on the saving host.
- **tvm-ffi**, as SGLang's ``load_jit`` (``sglang/kernels/jit/utils/compile.py``) uses it, builds
  ``$TVM_FFI_CACHE_DIR/<module>__arch_<arch>__tvmffi_<version>/<module>.so`` (default
  ``~/.cache/tvm-ffi``; the module name ends with a hash of its sources) and loads that file
  whenever it exists, without ninja; it rebuilds only when loading it fails. tvm-ffi's own
  ``load_inline`` (``<name>_<hash>/``) runs ninja in its build directory like FlashInfer. So a
  module's build directory is carried whole, with modification times; the files name no path the
  ``.so`` check depends on, so they are placed wherever the cache is.

Lock files (``lock``, ``*.lock``) are the loaders' own and are not carried. Nor is tvm-ffi's torch
DLPack addon (``libtorch_c_dlpack_addon_torch<ver>-cuda.so`` at the cache's top): ``import tvm_ffi``
builds it, before any engine seam, and only for a torch without its own DLPack exchange API.

A start counts as using a module when its library is mapped in the process at the time of asking
(a module built but never loaded, or unloaded again, is not carried): :func:`mapped_files` reads
``/proc/self/maps``, and each tree's ``used`` holds the directories of the libraries mapped under
its root.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from foundry_core.engine.host_caches import CacheTree

logger = logging.getLogger("foundry")

__all__ = ["BUILT", "FLASHINFER", "TVM_FFI", "flashinfer_root", "flashinfer_tree", "flashinfer_unit", "mapped_files",
           "module_dirs", "not_a_lock", "trees", "tvm_ffi_root", "tvm_ffi_tree"]

FLASHINFER = "flashinfer"
TVM_FFI = "tvm_ffi"
MAPS = "/proc/self/maps"
BUILT, _GENERATED = "cached_ops", "generated"  # FlashInfer's module and generated-source folders
_unreadable_maps_said = False  # SAVE's watch asks every second: the warning is given once


def flashinfer_root(environ: Mapping[str, str] | None = None) -> Path:
    """FlashInfer's cache directory: the imported FlashInfer's own, else where it would put it
    (``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``, the home directory by default)."""
    env = sys.modules.get("flashinfer.jit.env")
    if environ is None and env is not None and isinstance(getattr(env, "FLASHINFER_CACHE_DIR", None), Path):
        return env.FLASHINFER_CACHE_DIR
    environ = os.environ if environ is None else environ
    return Path(environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home()) / ".cache" / "flashinfer"


def tvm_ffi_root(environ: Mapping[str, str] | None = None) -> Path:
    """tvm-ffi's build cache as SGLang's load_jit reads it (``$TVM_FFI_CACHE_DIR``, default
    ``~/.cache/tvm-ffi``)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("TVM_FFI_CACHE_DIR") or "~/.cache/tvm-ffi").expanduser()


def mapped_files(maps: str | os.PathLike = MAPS) -> list[Path]:
    """The files this process has mapped (its loaded libraries among them), from ``maps``; [] when
    it cannot be read (not Linux), which is said once at WARNING."""
    global _unreadable_maps_said
    try:
        text = Path(maps).read_text(errors="replace")
    except OSError as exc:
        if not _unreadable_maps_said:
            logger.warning("foundry: %s cannot be read (%s), so no JIT module this start loaded is carried in the "
                           "archive; a LOAD on a new host compiles them (Linux's /proc must be mounted)", maps, exc)
            _unreadable_maps_said = True
        return []
    found: dict[str, None] = {}
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith(" (deleted)"):
            found[fields[5]] = None
    return [Path(p) for p in found]


@functools.lru_cache(maxsize=8192)
def _resolved(path: str) -> str:
    """A mapped file's path through its links, found once per process (a loaded library stays
    where it is): SAVE's watch asks it for each of the hundreds of files an engine's process maps,
    for both caches, every second."""
    return os.path.realpath(path)


def module_dirs(root: Path, mapped: Iterable[Path]) -> list[str]:
    """The directories (relative to ``root``, POSIX) holding a file of ``mapped`` under ``root``."""
    base = os.path.join(os.path.realpath(root), "")  # with its trailing "/"
    dirs: dict[str, None] = {}
    for path in mapped:
        real = _resolved(os.fspath(path))
        parent = os.path.dirname(real[len(base):]) if real.startswith(base) else ""
        if parent:
            dirs[parent] = None
    return list(dirs)


def not_a_lock(path: str) -> bool:
    name = PurePosixPath(path).name
    return name != "lock" and not name.endswith(".lock")


def _is_library(path: str) -> bool:
    return path.endswith(".so")


def flashinfer_unit(path: str) -> str:
    """A module's files go together: ``<version>/<arch>/{cached_ops,generated}/<name>/...`` ->
    ``<version>/<arch>/<name>``."""
    parts = PurePosixPath(path).parts
    if len(parts) > 4 and parts[2] in (BUILT, _GENERATED):
        return "/".join((*parts[:2], parts[3]))
    return path


def flashinfer_tree(root: Path | None = None, mapped: Iterable[Path] = ()) -> CacheTree:
    """FlashInfer's JIT cache; ``used``: each module directory a file of ``mapped`` lies in
    (``<version>/<arch>/cached_ops/<name>``) and its generated sources' directory when it has one."""
    root = flashinfer_root() if root is None else root
    used: list[str] = []
    for rel in module_dirs(root, mapped):
        parts = PurePosixPath(rel).parts
        if len(parts) != 4 or parts[2] != BUILT:
            continue
        used.append(rel)
        generated = "/".join((*parts[:2], _GENERATED, parts[3]))
        if (root / generated).is_dir():
            used.append(generated)
    return CacheTree(FLASHINFER, root, tuple(used), keep=not_a_lock, unit=flashinfer_unit, last=_is_library,
                     mtimes=True, bound_to_root=True)


def tvm_ffi_tree(root: Path | None = None, mapped: Iterable[Path] = ()) -> CacheTree:
    """tvm-ffi's build cache; ``used``: each build directory (directly under the root) a file of
    ``mapped`` lies in."""
    root = tvm_ffi_root() if root is None else root
    used = tuple(rel for rel in module_dirs(root, mapped) if "/" not in rel)
    return CacheTree(TVM_FFI, root, used, keep=not_a_lock, unit=lambda path: path.partition("/")[0],
                     last=_is_library, mtimes=True)


def trees(mapped: Iterable[Path] | None = None) -> list[CacheTree]:
    """Both caches, ``used`` from ``mapped`` (default: this process's mapped files)."""
    files = mapped_files() if mapped is None else list(mapped)
    return [flashinfer_tree(mapped=files), tvm_ffi_tree(mapped=files)]
