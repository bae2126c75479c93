"""vLLM's torch.compile cache, carried in the archive (``foundry_core.engine.host_caches``).

vLLM keeps what torch.compile made for a model under ``VLLM_CACHE_ROOT/torch_compile_cache``: with
its AOT compile (the plugin's default) in ``torch_aot_compile/<hash>`` (the whole-model artifact per
rank in ``rank_<r>_<dp>/`` and Inductor's cache beside them), and where vLLM compiled the model in
pieces in ``<hash>`` (``compilation_config.cache_dir``). SAVE carries the directories this start
used, leaving out other ranks' ``rank_*`` directories: those ``compilation_config.cache_dir`` and
``local_cache_dir`` name, and the AOT directory of each compiled module of the model
(``_aot_cache_dir``: a start that compiled the model replaced ``local_cache_dir`` with its pieces'
directory); LOAD copies the files a fresh host lacks back under its own
``VLLM_CACHE_ROOT`` when the worker starts, before vLLM looks for its compiled model. The hash is
vLLM's own cache key (its version, the model config, the traced sources, torch), so a LOAD that
passes the archive's fingerprint finds the directory under the same name.

vLLM's model-class inspection (``VLLM_CACHE_ROOT/modelinfos``) is carried too: on a host without
it, vLLM's first process inspects the model's class in a subprocess before it starts the engine
(18 s with Qwen3 on the H200, outside vLLM's engine init). :func:`restore_model_info` puts rank 0's
copy back in that first process when the plugin activates; vLLM checks each file against a hash of
the model's source before it uses it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from foundry_core.engine.host_caches import CacheTree, Copied, HostCaches
from foundry_core.engine.layout import rank_dir

CACHE = "vllm_compile"
COMPILE_DIR = "torch_compile_cache"
AOT_DIR = "torch_aot_compile"
MODEL_INFO_DIR = "modelinfos"
_RANK_DIR = re.compile(r"rank_\d+_\d+")


def cache_root() -> Path:
    """vLLM's ``VLLM_CACHE_ROOT`` as vLLM reads it."""
    import vllm.envs as envs

    return Path(envs.VLLM_CACHE_ROOT)


def hash_dir(path: str | os.PathLike | None, root: Path) -> str | None:
    """The cache-key directory holding ``path`` (relative to ``root``, POSIX), or None when
    ``path`` is not inside vLLM's compile cache under ``root``."""
    if not path:
        return None
    try:
        rel = Path(path).resolve().relative_to((root / COMPILE_DIR).resolve())
    except (ValueError, OSError):
        return None
    depth = 2 if rel.parts[:1] == (AOT_DIR,) else 1
    if len(rel.parts) < depth:
        return None
    return str(PurePosixPath(COMPILE_DIR, *rel.parts[:depth]))


def used_dirs(compilation_config: Any, root: Path, also: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The cache-key directories vLLM's compile used in this process (see the module); ``also``:
    more paths inside them (the model's AOT directories)."""
    found: list[str] = []
    named = [getattr(compilation_config, name, None) for name in ("cache_dir", "local_cache_dir")]
    for path in [*named, *also]:
        rel = hash_dir(path, root)
        if rel is not None and rel not in found and (root / rel).is_dir():
            found.append(rel)
    return tuple(found)


def own_rank_only(rank_dir_name: str) -> Any:
    """A ``keep`` for :meth:`HostCaches.add_tree`: every file except another rank's."""

    def keep(path: str) -> bool:
        return not any(_RANK_DIR.fullmatch(part) and part != rank_dir_name for part in PurePosixPath(path).parts)

    return keep


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
    return CacheTree(CACHE, root, used, own_rank_only(f"rank_{rank}_{dp_rank}"))


def restore_model_info(archive: str | os.PathLike, root: Path | None = None) -> Copied | None:
    """Puts the model-class inspection rank 0 carried into this host's cache where it lacks it
    (see the module); None when the archive carries none."""
    caches = HostCaches.read(archive, rank_dir(archive, 0))
    if caches is None:
        return None
    return caches.restore_tree(CACHE, cache_root() if root is None else root, MODEL_INFO_DIR)


__all__ = ["CACHE", "cache_root", "hash_dir", "used_dirs", "aot_dirs", "own_rank_only", "tree", "restore_model_info"]
