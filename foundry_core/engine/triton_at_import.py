"""Triton's C modules that an engine's imports build, carried in the archive and placed before
those imports run.

Triton builds small C modules with the host's C compiler and keeps each in its cache directory,
under a key of its own: its driver's ``cuda_utils`` when the driver is first used, a launcher
per kernel signature. The Triton carrier (:mod:`foundry_core.engine.triton_cache`) hears only of
what a process looks up once the carrier is installed, in the engine's worker. SGLang 0.5.17 uses
Triton's driver at import: ``sglang/srt/server_args.py`` imports the fla kernels, whose
``utils.py`` asks the driver for its target at module level. So on a new host the main process
and the fork server each build ``cuda_utils`` (a ``cc1`` on Triton's ``driver.c``) before any
scheduler exists: the H200's cold LOAD starts showed their first log line and the fork server's
imports each 1.4-1.6 s later than the warm ones.

- SAVE, in the worker once it has run: :func:`tree` names the key directory of every Triton
  module mapped into the process from Triton's own cache directory that the carrier never heard
  of, so loaded before it was installed: ``cuda_utils``, which a forked worker maps because the
  fork server's imports loaded it. They are carried as :data:`CACHE`.
- LOAD, in the fork server before its imports: :func:`place_from_environ` copies them into
  Triton's cache directory where this host lacks them, from the archive the main process named in
  :data:`ARCHIVE_ENV`. The main process reaches the same import seconds later, after torch, and
  finds the module there.

Only the standard library is imported until there is an archive to place from: the fork server
runs this before it imports anything else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

CACHE = "triton-at-import"  # the archive's name for these modules (apart from the worker's kernels)
# Set by the main process for its fork server alone: the archive a LOAD (or an auto start) names.
ARCHIVE_ENV = "FOUNDRY_FORK_SERVER_ARCHIVE"
MODULE_SUFFIX = ".so"

__all__ = ["ARCHIVE_ENV", "CACHE", "cache_dir", "fork_server_environ", "loaded_keys", "place",
           "place_from_environ", "tree"]


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Triton's cache directory as Triton 3.x finds it (``triton/knobs.py``: ``TRITON_CACHE_DIR``,
    else ``$TRITON_HOME/.triton/cache``, ``TRITON_HOME`` defaulting to the user's home), without
    importing Triton."""
    env = os.environ if environ is None else environ
    if env.get("TRITON_CACHE_DIR"):
        return Path(env["TRITON_CACHE_DIR"])
    home = env.get("TRITON_HOME") or os.path.expanduser("~/")
    return Path(home, ".triton", "cache")


def loaded_keys(home: str | os.PathLike, mapped: Iterable[Path], looked_up: Iterable[str] = ()) -> tuple[str, ...]:
    """The keys (directory names under ``home``) of the Triton modules among ``mapped`` files,
    less those in ``looked_up`` (the keys the worker's carrier heard of, which it carries itself)."""
    root = os.path.realpath(home)
    keys = set()
    for path in mapped:
        if not path.name.endswith(MODULE_SUFFIX):
            continue
        parent = os.path.dirname(os.path.realpath(path))
        if os.path.dirname(parent) == root:
            keys.add(os.path.basename(parent))
    return tuple(sorted(keys - set(looked_up)))


def tree(home: str | os.PathLike | None = None, mapped: Iterable[Path] | None = None,
         looked_up: Iterable[str] = ()) -> Any:
    """SAVE: the :class:`~foundry_core.engine.host_caches.CacheTree` of the Triton modules this
    process maps from ``home`` (default: :func:`cache_dir`) and its carrier did not look up
    (``looked_up``: their keys), each key directory whole."""
    from foundry_core.engine.host_caches import CacheTree
    from foundry_core.engine.jit_dirs import mapped_files

    root = Path(home) if home is not None else cache_dir()
    files = mapped_files() if mapped is None else mapped
    return CacheTree(CACHE, root, used=loaded_keys(root, files, looked_up), unit=lambda rel: rel.partition("/")[0])


def place(archive: str | os.PathLike, target: str | os.PathLike | None = None) -> Any:
    """LOAD: copies the archive's :data:`CACHE` modules (rank 0's list: every rank's imports build
    the same ones) into ``target`` (default: :func:`cache_dir`) where it lacks them, each key
    directory whole; returns the :class:`~foundry_core.engine.host_caches.Copied`, or None when
    the archive carries none. A damaged carried file is refused with a warning; an OSError while
    placing (a full disk) is raised, and the fork server's status says so. Either way Triton
    builds the module, as without the archive."""
    from foundry_core.engine import host_caches
    from foundry_core.engine.layout import rank_dir

    if not host_caches.enabled():
        return None
    source = host_caches.HostCaches.read(archive, rank_dir(archive, 0))
    if source is None or not source.paths(CACHE):
        return None
    return source.restore_tree(CACHE, target if target is not None else cache_dir(),
                               unit=lambda rel: rel.partition("/")[0])


def fork_server_environ(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """What the main process gives its fork server for :func:`place_from_environ`: the archive
    (absolute) when the command asks for a LOAD or an auto start (``--foundry-mode`` or
    ``FOUNDRY_MODE``, default auto) with an archive (``--foundry-archive`` or ``FOUNDRY_ARCHIVE``);
    else nothing."""
    from foundry_core.autopreload import requested

    mode, archive = requested(argv, environ)
    if (mode or "auto") not in ("auto", "load") or not archive or not archive.strip():
        return {}
    archive = archive.strip()
    return {ARCHIVE_ENV: os.path.abspath(os.path.expanduser(archive))}


def place_from_environ(environ: Mapping[str, str] | None = None) -> str:
    """The fork server's step before its imports: :func:`place` from :data:`ARCHIVE_ENV`'s
    archive; returns what it did, for the fork server's status ("" when there was nothing)."""
    env = os.environ if environ is None else environ
    archive = env.get(ARCHIVE_ENV, "").strip()
    if not archive:
        return ""
    done = place(archive)
    return f"Triton's modules built at import, from the archive: {done.describe()}" if done else ""
