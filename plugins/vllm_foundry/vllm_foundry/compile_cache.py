"""vLLM's torch.compile cache, carried in the archive (``foundry_core.engine.host_caches``).

vLLM keeps what torch.compile made for a model under ``VLLM_CACHE_ROOT/torch_compile_cache``: with
its AOT compile (the plugin's default) in ``torch_aot_compile/<hash>`` (the whole-model artifact per
rank in ``rank_<r>_<dp>/`` and Inductor's cache beside them), and where vLLM compiled the model in
pieces in ``<hash>`` (``compilation_config.cache_dir``). SAVE carries the directories this start
used (named by ``compilation_config.cache_dir`` and ``local_cache_dir``), leaving out other ranks'
``rank_*`` directories; LOAD copies the files a fresh host lacks back under its own
``VLLM_CACHE_ROOT`` when the worker starts, before vLLM looks for its compiled model. The hash is
vLLM's own cache key (its version, the model config, the traced sources, torch), so a LOAD that
passes the archive's fingerprint finds the directory under the same name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from foundry_core.engine.host_caches import CacheTree

CACHE = "vllm_compile"
COMPILE_DIR = "torch_compile_cache"
AOT_DIR = "torch_aot_compile"
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


def used_dirs(compilation_config: Any, root: Path) -> tuple[str, ...]:
    """The cache-key directories vLLM's compile used in this process (see the module)."""
    found: list[str] = []
    for name in ("cache_dir", "local_cache_dir"):
        rel = hash_dir(getattr(compilation_config, name, None), root)
        if rel is not None and rel not in found and (root / rel).is_dir():
            found.append(rel)
    return tuple(found)


def own_rank_only(rank_dir_name: str) -> Any:
    """A ``keep`` for :meth:`HostCaches.add_tree`: every file except another rank's."""

    def keep(path: str) -> bool:
        return not any(_RANK_DIR.fullmatch(part) and part != rank_dir_name for part in PurePosixPath(path).parts)

    return keep


def tree(vllm_config: Any, root: Path | None = None) -> CacheTree:
    """This worker's compile cache as a carried tree (``used`` is empty before vLLM compiled)."""
    root = cache_root() if root is None else root
    parallel = getattr(vllm_config, "parallel_config", None)
    rank = int(getattr(parallel, "rank", 0) or 0)
    dp_rank = int(getattr(parallel, "data_parallel_index", 0) or 0)
    compilation = getattr(vllm_config, "compilation_config", None)
    return CacheTree(CACHE, root, used_dirs(compilation, root) if compilation is not None else (),
                     own_rank_only(f"rank_{rank}_{dp_rank}"))


__all__ = ["CACHE", "cache_root", "hash_dir", "used_dirs", "own_rank_only", "tree"]
