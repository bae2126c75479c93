"""Where engines and their libraries keep what a first start compiles, and the environment of a
start "on a new host": every one of those locations pointed at a fresh empty directory.

Each row of :data:`CACHE_VARIABLES` names the variable, the location its reader uses when it is
unset (for the warm-up check) and where the variable was read. Every cold start sets all rows,
whatever the engine: a new host has none of them, and a variable an engine does not read changes
nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from foundry_core.archive_names import LIST_NAME
from foundry_core.engine.host_caches import is_temporary
from foundry_core.engine.jit_dirs import not_a_lock


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or os.path.expanduser("~"))


def _xdg_cache(env: Mapping[str, str]) -> Path:
    return Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else _home(env) / ".cache"


def _user(env: Mapping[str, str]) -> str:
    return env.get("USER") or env.get("LOGNAME") or "user"


def _tmp(env: Mapping[str, str]) -> Path:
    return Path(env.get("TMPDIR") or "/tmp")


@dataclass(frozen=True)
class CacheVariable:
    """``name`` is set to ``<fresh dir>/<subdir>`` in a cold start; ``default(env)`` is where its
    reader looks when it is unset; ``read_in`` says where that was read."""

    name: str
    subdir: str
    default: Callable[[Mapping[str, str]], Path]
    read_in: str


CACHE_VARIABLES: tuple[CacheVariable, ...] = (
    CacheVariable("XDG_CACHE_HOME", "xdg-cache", _xdg_cache,
                  "vllm 0.25.0 vllm/envs.py get_default_cache_root (VLLM_CACHE_ROOT's parent); also torch's "
                  "extension builds and Outlines (vllm/v1/structured_output/utils.py)"),
    CacheVariable("VLLM_CACHE_ROOT", "vllm", lambda env: _xdg_cache(env) / "vllm",
                  "vllm 0.25.0 vllm/envs.py VLLM_CACHE_ROOT: torch_compile_cache/, modelinfos/"),
    CacheVariable("TORCHINDUCTOR_CACHE_DIR", "inductor",
                  lambda env: _tmp(env) / f"torchinductor_{_user(env)}",
                  "torch/_inductor/runtime/cache_dir_utils.py cache_dir(); vllm 0.25.0 "
                  "vllm/compilation/compiler_interface.py and sglang 0.5.17 sglang/srt/compilation/"
                  "compiler_interface.py move it under their own compile cache once compiling"),
    CacheVariable("TRITON_CACHE_DIR", "triton", lambda env: _home(env) / ".triton" / "cache",
                  "triton 3.x triton/knobs.py cache.dir (default $TRITON_HOME/.triton/cache)"),
    CacheVariable("TRITON_HOME", "triton-home", _home,
                  "triton 3.x triton/knobs.py cache.home_dir (the cache's, dump's and override's parent)"),
    CacheVariable("FLASHINFER_WORKSPACE_BASE", "flashinfer", _home,
                  "flashinfer 0.6.15 flashinfer/jit/env.py FLASHINFER_BASE_DIR: JIT modules in "
                  ".cache/flashinfer/<version>/<arch>/cached_ops"),
    CacheVariable("TVM_FFI_CACHE_DIR", "tvm-ffi", lambda env: _home(env) / ".cache" / "tvm-ffi",
                  "apache-tvm-ffi 0.1.11 tvm_ffi/cpp/extension.py; sglang 0.5.17 "
                  "sglang/kernels/jit/utils/compile.py load_jit reads the same variable"),
    CacheVariable("SGLANG_CACHE_DIR", "sglang", lambda env: _home(env) / ".cache" / "sglang",
                  "sglang 0.5.17 sglang/srt/environ.py (FlashInfer autotune results, the compile backend's "
                  "cache, the custom all-reduce P2P table)"),
    CacheVariable("SGLANG_DG_CACHE_DIR", "deep-gemm", lambda env: _home(env) / ".cache" / "deep_gemm",
                  "sglang 0.5.17 sglang/srt/environ.py; sglang/srt/layers/deep_gemm_wrapper/compile_utils.py "
                  "sets DG_JIT_CACHE_DIR from it"),
    CacheVariable("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "cute-dsl",
                  lambda env: _tmp(env) / _user(env) / "flash_attention_cute_dsl_cache",
                  "vllm 0.25.0 vllm/vllm_flash_attn/cute/cache_utils.py"),
    CacheVariable("CUDA_CACHE_PATH", "cuda-compute-cache", lambda env: _home(env) / ".nv" / "ComputeCache",
                  "the CUDA driver's PTX JIT cache (CUDA C++ Programming Guide, CUDA environment variables)"),
    CacheVariable("HOME", "home", _home,
                  "belt and braces: any other per-user cache under ~ (the variables above are set explicitly)"),
)

# What a cold start keeps pointing at the host's own location when the user has not set it: not a
# compile cache, but configuration, installed packages and downloads that a new host gets with its
# install (a HOME of its own would otherwise hide them). Name -> location in the harness's env.
KEPT_LOCATIONS: dict[str, Callable[[Mapping[str, str]], Path]] = {
    # The user site-packages an engine may be installed in (site.getuserbase(): ~/.local).
    "PYTHONUSERBASE": lambda env: _home(env) / ".local",
    # Hugging Face's hub cache: a model given by name, not by path, is found where it was downloaded.
    "HF_HOME": lambda env: _xdg_cache(env) / "huggingface",
    # Configuration (vLLM's VLLM_CONFIG_ROOT defaults to $XDG_CONFIG_HOME/vllm), not a cache.
    "XDG_CONFIG_HOME": lambda env: _home(env) / ".config",
    # FlashInfer's downloaded cubins (flashinfer/jit/env.py _get_cubin_dir: under
    # FLASHINFER_WORKSPACE_BASE unless the flashinfer-cubin package is installed): downloads, not
    # compiled code, and a host without network could not fetch them again.
    "FLASHINFER_CUBIN_DIR": lambda env: Path(env.get("FLASHINFER_WORKSPACE_BASE") or _home(env))
    / ".cache" / "flashinfer" / "cubins",
}


def cold_environment(root: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a start on empty caches sets: :func:`cache_environment` over ``root``, which
    must not exist yet or be empty: the start would not be cold."""
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} is not empty: a cold start needs fresh cache directories")
    return cache_environment(root, environ)


def cache_environment(root: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each cache variable at its own directory under ``root`` (created here), and the
    :data:`KEPT_LOCATIONS` the user did not set at the host's location where it exists."""
    environ = os.environ if environ is None else environ
    root = Path(root)
    changes: dict[str, str] = {}
    for var in CACHE_VARIABLES:
        path = root / var.subdir
        path.mkdir(parents=True, exist_ok=True)
        changes[var.name] = str(path)
    for name, location in KEPT_LOCATIONS.items():
        if environ.get(name):
            continue
        path = location(environ)
        if path.exists():
            changes[name] = str(path)
    return changes


def location(name: str, environ: Mapping[str, str] | None = None) -> Path:
    """Where the cache variable ``name`` points in ``environ``: its value, else its reader's default."""
    environ = os.environ if environ is None else environ
    for var in CACHE_VARIABLES:
        if var.name == name:
            return Path(environ[name]) if environ.get(name) else var.default(environ)
    raise KeyError(f"{name} is not a cache variable (known: {', '.join(v.name for v in CACHE_VARIABLES)})")


def holds_files(path: Path) -> bool:
    """Whether ``path`` has at least one file anywhere below it."""
    for _, _, files in os.walk(path):
        if files:
            return True
    return False


TOP_ENTRIES = 20


NOT_CARRIED_ENTRIES = 60


def carried_paths(archive: str | os.PathLike | None) -> set[tuple[str, ...]] | None:
    """Every file the archive's ranks carry (their ``host_caches.json`` lists), as the parts of its
    path within its cache: a file in a cache directory is carried when its path there ends with
    one of them, wherever each cache's root is. None when the archive lists none."""
    if archive is None:
        return None
    paths: set[tuple[str, ...]] = set()
    listed = False
    for path in sorted(Path(archive).glob(f"rank*/{LIST_NAME}")):
        try:
            caches = json.loads(path.read_text()).get("caches") or {}
        except (OSError, ValueError, AttributeError):
            continue
        listed = True
        for files in caches.values():
            paths.update(PurePosixPath(rel).parts for rel in (files if isinstance(files, dict) else ()))
    return paths if listed else None


def _carried(parts: tuple[str, ...], carried: set[tuple[str, ...]]) -> bool:
    return any(parts[i:] in carried for i in range(len(parts)))


def _compared(parts: tuple[str, ...]) -> bool:
    """Whether a file counts against the archive: a lock, or a writer's temporary file or directory,
    is never carried."""
    return not any(is_temporary(part) for part in parts) and not_a_lock(parts[-1])


def inventory(env: Mapping[str, str | None], carried: set[tuple[str, ...]] | None = None) -> dict[str, dict]:
    """What each cache variable's directory in ``env`` holds, by variable: ``files`` and ``bytes``
    (plain files anywhere below it), ``top`` (up to :data:`TOP_ENTRIES` names directly in it, sorted).
    With ``carried`` (:func:`carried_paths`): ``not_carried``, how many of those files, locks and
    temporaries aside, the archive does not carry (the start wrote them, most likely compiling), and
    ``not_carried_paths``, up to :data:`NOT_CARRIED_ENTRIES` of them relative to the directory.

    After a cold start that is what Foundry placed from the archive plus what the start compiled,
    the only trace of why it took longer once its directories are emptied or removed. Each
    directory is walked on its own, so one inside another counts in both. Links are listed in
    ``top`` but neither followed nor counted (what they point at is held elsewhere). What cannot be
    read is skipped and counted as ``unreadable``; a directory that is not there is ``missing``."""
    return {var.name: _walk(value, carried) for var in CACHE_VARIABLES if (value := env.get(var.name))}


def _walk(root: str, carried: set[tuple[str, ...]] | None = None) -> dict:
    listing: dict = {"files": 0, "bytes": 0, "top": []}
    if carried is not None:
        listing.update(not_carried=0, not_carried_paths=[])
    try:
        with os.scandir(root) as it:
            pending = list(it)
    except FileNotFoundError:
        return {**listing, "missing": True}
    except OSError:
        return {**listing, "unreadable": 1}
    listing["top"] = sorted(entry.name for entry in pending)[:TOP_ENTRIES]
    unreadable = 0
    while pending:
        entry = pending.pop()
        try:
            if entry.is_dir(follow_symlinks=False):
                with os.scandir(entry.path) as it:
                    pending.extend(it)
            elif entry.is_file(follow_symlinks=False):
                listing["files"] += 1
                listing["bytes"] += entry.stat(follow_symlinks=False).st_size
                if carried is not None:
                    rel = os.path.relpath(entry.path, root)
                    parts = Path(rel).parts
                    if _compared(parts) and not _carried(parts, carried):
                        listing["not_carried"] += 1
                        listing["not_carried_paths"].append(rel)
        except OSError:
            unreadable += 1
    if unreadable:
        listing["unreadable"] = unreadable
    if carried is not None:
        listing["not_carried_paths"] = sorted(listing["not_carried_paths"])[:NOT_CARRIED_ENTRIES]
    return listing
