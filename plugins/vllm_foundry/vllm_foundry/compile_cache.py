"""vLLM's torch.compile cache, carried in the archive (``foundry_core.engine.host_caches``).

With its AOT compile (on by default with torch 2.10 and later, and the plugin loads the compiled
model whole) vLLM keeps a model's compiled code in ``VLLM_CACHE_ROOT/torch_compile_cache/
torch_aot_compile/<hash>``: the artifact of each rank in ``rank_<r>_<dp>/model`` and Inductor's
cache beside them. SAVE carries that directory, leaving out other ranks' ``rank_*`` directories; it
finds it through ``compilation_config.local_cache_dir`` (a start that loaded the artifact) and the
``_aot_cache_dir`` of the model's compiled modules (a start that compiled it: vLLM's backend then
replaced ``local_cache_dir`` with its pieces' directory). LOAD copies the files a fresh host lacks
back under its own ``VLLM_CACHE_ROOT`` on a thread from when the worker starts (the model loads
meanwhile; vLLM's first forward, which looks for the artifact, waits for it: worker_patches.py),
one hash directory at a time, the ``model`` files last. The hash is vLLM's own cache key (its
version, the model config, torch, Inductor's settings, its environment variables), so a LOAD that
passes the archive's fingerprint finds the directory under the same name once the key hashes SAVE's
values of the two host paths among those variables (compile_key.py).

vLLM's cache of compiled pieces (``torch_compile_cache/<hash>``, used without AOT compile) is not
carried: its index names its files by absolute paths of the host that wrote it, and
``VLLM_CACHE_ROOT`` is not part of its key, so on a host with another cache root vLLM would find
the directory and fail to load from the other host's paths. Such starts compile on a new host.

vLLM's model-class inspection (``VLLM_CACHE_ROOT/modelinfos``) is carried too: on a host without
it, vLLM's first process inspects the model's class in a subprocess before it starts the engine
(18 s with Qwen3 on the H200, outside vLLM's engine init). :func:`restore_model_info` puts rank 0's
copy back in that first process when the plugin activates; vLLM checks each file against a hash of
the model's source before it uses it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from foundry_core.engine.host_caches import CacheTree, Copied, HostCaches
from foundry_core.engine.layout import rank_dir

CACHE = "vllm_compile"
COMPILE_DIR = "torch_compile_cache"
AOT_DIR = "torch_aot_compile"
MODEL_INFO_DIR = "modelinfos"
ARTIFACT_NAME = "model"
_RANK_DIR = re.compile(r"rank_\d+_\d+")


def cache_root() -> Path:
    """vLLM's ``VLLM_CACHE_ROOT`` as vLLM reads it."""
    import vllm.envs as envs

    return Path(envs.VLLM_CACHE_ROOT)


def hash_dir(path: str | os.PathLike | None, root: Path) -> str | None:
    """The AOT hash directory holding ``path`` (relative to ``root``, POSIX), or None when
    ``path`` is not inside vLLM's AOT compile cache under ``root``."""
    if not path:
        return None
    try:
        rel = Path(path).resolve().relative_to((root / COMPILE_DIR / AOT_DIR).resolve())
    except (ValueError, OSError):
        return None
    return str(PurePosixPath(COMPILE_DIR, AOT_DIR, rel.parts[0])) if rel.parts else None


def used_dirs(compilation_config: Any, root: Path, also: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The AOT hash directories vLLM's compile used in this process (see the module); ``also``:
    more paths inside them (the model's compiled modules' directories)."""
    found: list[str] = []
    for path in [getattr(compilation_config, "local_cache_dir", None), *also]:
        rel = hash_dir(path, root)
        if rel is not None and rel not in found and (root / rel).is_dir():
            found.append(rel)
    return tuple(found)


def own_rank_only(rank_dir_name: str) -> Callable[[str], bool]:
    """A ``keep`` for :meth:`HostCaches.add_tree`: every file except another rank's."""

    def keep(path: str) -> bool:
        return not any(_RANK_DIR.fullmatch(part) and part != rank_dir_name for part in PurePosixPath(path).parts)

    return keep


def unit(path: str) -> str:
    """What LOAD restores whole: a hash directory, or one model-info file."""
    parts = PurePosixPath(path).parts
    return "/".join(parts[:3] if parts[:2] == (COMPILE_DIR, AOT_DIR) else parts[:2])


def is_artifact(path: str) -> bool:
    """vLLM looks for the ``model`` file first: it is placed after the rest of its directory."""
    return PurePosixPath(path).name == ARTIFACT_NAME


def aot_dirs(model: Any) -> tuple[str, ...]:
    """The AOT cache directories of the compiled modules of ``model`` (vLLM's
    ``@support_torch_compile`` modules set ``_aot_cache_dir`` when they compile), or ()."""
    for candidate in (model, getattr(model, "runnable", None), getattr(model, "model", None)):
        modules = getattr(candidate, "modules", None)
        if callable(modules):
            return tuple(d for m in modules() if isinstance(d := getattr(m, "_aot_cache_dir", None), str) and d)
    return ()


def tree(vllm_config: Any, root: Path | None = None, model: Any = None) -> CacheTree:
    """This worker's compile cache as a carried tree (``used`` is empty before vLLM compiled);
    ``model``: the runner's model, whose compiled modules name their AOT directories."""
    root = cache_root() if root is None else root
    parallel = getattr(vllm_config, "parallel_config", None)
    rank = int(getattr(parallel, "rank", 0) or 0)
    dp_rank = int(getattr(parallel, "data_parallel_index", 0) or 0)
    compilation = getattr(vllm_config, "compilation_config", None)
    used = used_dirs(compilation, root, aot_dirs(model)) if compilation is not None else ()
    if (root / MODEL_INFO_DIR).is_dir():
        used += (MODEL_INFO_DIR,)
    return CacheTree(CACHE, root, used, own_rank_only(f"rank_{rank}_{dp_rank}"), unit=unit, last=is_artifact)


def restore_model_info(archive: str | os.PathLike, root: Path | None = None) -> Copied | None:
    """Puts the model-class inspection rank 0 carried into this host's cache where it lacks it
    (see the module); None when the archive carries none."""
    caches = HostCaches.read(archive, rank_dir(archive, 0))
    if caches is None:
        return None
    return caches.restore_tree(CACHE, cache_root() if root is None else root, MODEL_INFO_DIR, unit=unit)


__all__ = ["CACHE", "cache_root", "hash_dir", "used_dirs", "aot_dirs", "own_rank_only", "unit", "is_artifact", "tree",
           "restore_model_info"]
