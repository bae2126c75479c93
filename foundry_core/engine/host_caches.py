"""Host caches carried in the archive: the compiled code an engine start reads from caches on the
host (Triton's kernel cache, the engine's torch.compile cache), so that LOAD on a fresh host (a new
node, a new container) does not compile it again.

::

    <archive>/host_caches/<sha256>         the carried files, named by their content
    <archive>/rank<r>/host_caches.json     rank r's list: cache -> {path in the cache: {size, sha256,
                                           mtime_ns (optional)}}, and each cache's directory at SAVE

The list's format and its checks belong to the archive format (:mod:`foundry_core.cache_list`,
which ``foundry verify`` uses too); this module writes and reads it for an engine's start.

Files are stored by content, so ranks that carry the same bytes store them once, a later SAVE into
the same archive adds what changed without touching what a list still names, and a name always
means the same bytes (two writers of one file write the same thing). SAVE adds the files after
the engine's warmup (the graphs are already complete: a start that dies here leaves a usable
archive without caches).

LOAD copies a listed file into the host's cache only where the host has nothing at that path, in
units (a Triton kernel, vLLM's compile directory of a model) that are used whole or not at all:
every file of a unit is first copied beside its place and checked against its size and SHA-256,
then all are renamed into place, the files that make the unit visible to its reader (Triton's
group file, vLLM's compiled model) last. A unit with a file that fails its check is not used and a
warning names the file: the engine compiles that entry itself, as a start without the archive
does. ``FOUNDRY_HOST_CACHES=0`` turns carrying off. Reading the list and placing files count on
the start's critical path as ``host caches`` (:mod:`foundry_core.engine.critical_path`), except on
Foundry's own threads.

Caches whose reader is ninja (FlashInfer's and tvm-ffi's JIT builds, :mod:`foundry_core.engine.jit_dirs`)
are carried with each file's modification time and placed with it, since ninja compares file
times with its records; a unit of theirs is placed only where the host has none of its files
(ninja's records must describe the files beside them). Where a cache was on the saving host is
listed too: a cache whose records name absolute paths is placed only at the same path, unless its
reader is made to take the files as built (FlashInfer's: :mod:`foundry_core.engine.flashinfer_builds`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundry_core.archive_names import BLOB_NAME, CACHES_DIR, LIST_NAME
from foundry_core.cache_list import (
    CHUNK,
    LIST_FORMAT,
    LIST_VERSION,
    Entry,
    file_digest,
    listed_blobs,
    open_regular,
    parse_list,
    read_list,
    safe_path,
)
from foundry_core.engine import options
from foundry_core.engine.critical_path import LEDGER
from foundry_core.engine.layout import atomic_write_json
from foundry_core.errors import ArchiveIOError, FormatError

logger = logging.getLogger("foundry")

ENABLE_ENV = "FOUNDRY_HOST_CACHES"


def enabled(environ: Any = None) -> bool:
    """Whether starts carry host caches in the archive (FOUNDRY_HOST_CACHES, default on)."""
    return options.env_flag(ENABLE_ENV, environ=environ)


@dataclass(frozen=True)
class CacheTree:
    """A cache an engine reads compiled code from, other than Triton's: ``cache`` names it in the
    archive, ``root`` is its directory on this host, ``used`` the directories under ``root`` this
    start used (what SAVE carries), ``keep(path)`` leaves files out (another rank's),
    ``unit(path)`` names the unit a file is restored with (default: the whole cache), ``last(path)``
    marks the files a unit's reader looks for first (placed after the others). ``mtimes``: the
    reader compares file times (ninja), so each file is carried with its modification time and
    placed with it; ``bound_to_root``: the reader's records name absolute paths under ``root``, so
    LOAD places the files only where ``root`` is the saving host's, unless ``relocatable``: the
    reader was made to take them as built at another root too
    (:mod:`foundry_core.engine.flashinfer_builds`)."""

    cache: str
    root: Path
    used: tuple[str, ...] = ()
    keep: Callable[[str], bool] | None = None
    unit: Callable[[str], str] | None = None
    last: Callable[[str], bool] | None = None
    mtimes: bool = False
    bound_to_root: bool = False
    relocatable: bool = False


@dataclass
class Copied:
    """What one carry did: files copied and their bytes, files already present, files refused."""

    files: int = 0
    bytes: int = 0
    present: int = 0
    refused: int = 0

    def add(self, other: Copied) -> None:
        self.files += other.files
        self.bytes += other.bytes
        self.present += other.present
        self.refused += other.refused

    def describe(self) -> str:
        text = f"{self.files} files ({self.bytes / 2**20:.1f} MiB) copied, {self.present} present"
        return text + (f", {self.refused} refused" if self.refused else "")


def is_temporary(name: str) -> bool:
    """A writer's unfinished file or directory: Triton's ``tmp.pid_*``, ours and Inductor's
    ``.*.tmp*``, vLLM's ``model.<pid>.tmp``."""
    return name.startswith("tmp.") or name.endswith(".tmp") or ".tmp." in name


def _temporary_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}")


def _listed(entry: Entry) -> dict[str, Any]:
    listed: dict[str, Any] = {"size": entry.size, "sha256": entry.sha256}
    if entry.mtime_ns is not None:
        listed["mtime_ns"] = entry.mtime_ns
    return listed


class HostCaches:
    """One rank's carried caches: what SAVE adds (:meth:`add_tree` or :meth:`add_used`, then
    :meth:`write_list`) and what LOAD copies back (:meth:`read`, then :meth:`restore_tree` or
    :meth:`restore`)."""

    def __init__(self, archive: str | os.PathLike, rank_dir: str | os.PathLike) -> None:
        self.root = Path(archive) / CACHES_DIR
        self.list_path = Path(rank_dir) / LIST_NAME
        self.entries: dict[str, dict[str, Entry]] = {}
        self.roots: dict[str, str] = {}  # cache -> its directory on the saving host
        self._by_head: dict[str, dict[str, list[str]]] = {}  # cache -> first path component -> paths

    # ---- SAVE ----------------------------------------------------------------------------------

    def add_tree(self, cache: str, source: str | os.PathLike, sub: str = "",
                 rewrite: Callable[[str, bytes], bytes] | None = None,
                 keep: Callable[[str], bool] | None = None, mtimes: bool = False) -> Copied:
        """Adds every regular file under ``source/sub`` to cache ``cache`` at its path relative
        to ``source``, except unfinished writes and those ``keep`` refuses. ``rewrite(path,
        content)`` may change a file's bytes before they are stored (an absolute path of this host
        inside it); ``mtimes`` records each file's modification time. Files that vanish while
        walked are left out."""
        base = Path(source)
        self.roots[cache] = os.path.realpath(base)
        done = Copied()
        for dirpath, dirnames, filenames in os.walk(base / sub if sub else base):
            dirnames[:] = [d for d in dirnames if not is_temporary(d)]
            for name in filenames:
                path = Path(dirpath, name)
                rel = path.relative_to(base).as_posix()
                if is_temporary(name) or safe_path(rel) is None or (keep is not None and not keep(rel)):
                    continue
                try:
                    with os.fdopen(open_regular(path), "rb") as f:
                        mtime_ns = os.fstat(f.fileno()).st_mtime_ns
                        content = f.read()
                except OSError as exc:  # vanished, or not a regular file: not carried
                    logger.warning("foundry: %s not carried in the archive (%s); a LOAD on a new host compiles it",
                                   path, exc)
                    continue
                self._store(cache, rel, rewrite(rel, content) if rewrite is not None else content, done,
                            mtime_ns if mtimes else None)
        return done

    def add_used(self, tree: CacheTree) -> Copied:
        """Adds the directories ``tree`` used (``tree.used``) with the tree's ``keep`` and ``mtimes``."""
        done = Copied()
        for sub in tree.used:
            done.add(self.add_tree(tree.cache, tree.root, sub, keep=tree.keep, mtimes=tree.mtimes))
        return done

    def _store(self, cache: str, rel: str, content: bytes, done: Copied, mtime_ns: int | None = None) -> None:
        entry = Entry.of(content, mtime_ns)
        blob = self.root / entry.sha256
        if os.path.lexists(blob):
            done.present += 1
        else:
            blob.parent.mkdir(parents=True, exist_ok=True)
            tmp = _temporary_beside(blob)
            try:
                tmp.write_bytes(content)
                os.replace(tmp, blob)  # a concurrent writer of this name writes the same bytes
            finally:
                tmp.unlink(missing_ok=True)
            done.files += 1
            done.bytes += entry.size
        self.entries.setdefault(cache, {})[rel] = entry
        self._by_head.pop(cache, None)

    def write_list(self) -> None:
        """Writes this rank's list (atomically); the carried files are usable from then on."""
        atomic_write_json(self.list_path, {
            "format": LIST_FORMAT, "version": LIST_VERSION,
            "caches": {cache: {rel: _listed(e) for rel, e in sorted(files.items())}
                       for cache, files in sorted(self.entries.items())},
            "roots": {cache: root for cache, root in sorted(self.roots.items()) if cache in self.entries}})

    # ---- LOAD ----------------------------------------------------------------------------------

    @classmethod
    def read(cls, archive: str | os.PathLike, rank_dir: str | os.PathLike) -> HostCaches | None:
        """This rank's carried caches, or None when the archive carries none. A list that cannot
        be read is logged and treated as none (the start compiles, as without the archive)."""
        caches = cls(archive, rank_dir)
        try:
            with LEDGER.timed("host caches"):
                if not os.path.lexists(caches.list_path):
                    return None
                listed = read_list(caches.list_path)
        except (ArchiveIOError, FormatError) as exc:
            logger.warning("foundry: the archive's host caches are not used: %s; this start compiles what its caches "
                           "lack (`foundry verify ARCHIVE` checks the archive, a SAVE writes the list again)", exc)
            return None
        caches.entries, caches.roots = listed.entries, listed.roots
        return caches

    def paths(self, cache: str, prefix: str = "") -> list[str]:
        """The carried paths of ``cache`` under directory ``prefix`` ("" for all). Indexed by the
        first path component: Triton asks once per kernel it opens, at LOAD's JIT warmup."""
        if not prefix:
            return list(self.entries.get(cache, {}))
        if cache not in self._by_head:
            heads: dict[str, list[str]] = {}
            for rel in self.entries.get(cache, {}):
                heads.setdefault(rel.partition("/")[0], []).append(rel)
            self._by_head[cache] = heads
        start = prefix.rstrip("/") + "/"
        return [rel for rel in self._by_head[cache].get(start.partition("/")[0], ()) if rel.startswith(start)]

    def restore_tree(self, cache: str, target: str | os.PathLike, prefix: str = "", *, strip: bool = False,
                     rewrite: Callable[[str, bytes], bytes] | None = None,
                     unit: Callable[[str], str] | None = None, last: Callable[[str], bool] | None = None,
                     untouched_units_only: bool = False) -> Copied:
        """Copies the carried files of ``cache`` under ``prefix`` that ``target`` lacks into it,
        at their paths (``strip``: relative to ``prefix``), one unit at a time (``unit(path)``,
        default one unit), each whole or not at all (see the module). ``rewrite(path, content)``
        adapts a file to this host; ``last(path)`` files are placed after the others of their
        unit; ``untouched_units_only``: a unit of which the host has any file is left to the host.
        An OSError while placing (a full disk) undoes the unit and is raised."""
        with LEDGER.timed("host caches"):
            cut = len(prefix.rstrip("/")) + 1 if strip and prefix else 0
            units: dict[str, list[str]] = {}
            for rel in self.paths(cache, prefix):
                units.setdefault(unit(rel) if unit is not None else "", []).append(rel)
            done = Copied()
            for rels in units.values():
                pairs = [(rel, rel[cut:]) for rel in rels]
                present = sum(os.path.lexists(Path(target, dest)) for _, dest in pairs) if untouched_units_only else 0
                done.add(Copied(present=present) if present else self._restore_unit(cache, Path(target), pairs, rewrite,
                                                                                      last))
            return done

    def restore(self, tree: CacheTree) -> Copied:
        """Copies the carried files of ``tree.cache`` that ``tree.root`` lacks into it, by the
        tree's units (:meth:`restore_tree`); none (and a line saying why) when the tree is
        ``bound_to_root`` and the saving host's root was another, unless the tree is ``relocatable``:
        its reader would not use them."""
        saved = self.roots.get(tree.cache)
        if tree.bound_to_root and not tree.relocatable and saved is not None and saved != os.path.realpath(tree.root):
            logger.warning("foundry: the archive's %s files are not placed: they were built in %s, this host's %s is "
                           "%s, and their build records name absolute paths (the engine builds them; use the saving "
                           "host's path to have them from the archive)", tree.cache, saved, tree.cache, tree.root)
            return Copied()
        # Ninja's records (mtimes trees) must describe the files beside them: a unit the host has
        # begun stays the host's.
        return self.restore_tree(tree.cache, tree.root, unit=tree.unit, last=tree.last,
                                 untouched_units_only=tree.mtimes)

    def _restore_unit(self, cache: str, target: Path, rels: list[tuple[str, str]],
                      rewrite: Callable[[str, bytes], bytes] | None, last: Callable[[str], bool] | None) -> Copied:
        done = Copied()
        staged: list[tuple[Path, Path, str]] = []  # (temporary, destination, destination path)
        try:
            for rel, dest_rel in rels:
                dest = target / dest_rel
                if os.path.lexists(dest):
                    done.present += 1
                    continue
                entry = self.entries[cache][rel]
                tmp = self._stage(cache, rel, entry, dest)
                if tmp is None:
                    done.refused += len(rels) - done.present
                    return Copied(present=done.present, refused=done.refused)
                staged.append((tmp, dest, dest_rel))
                if rewrite is not None:
                    content = tmp.read_bytes()
                    if (changed := rewrite(dest_rel, content)) != content:
                        tmp.write_bytes(changed)
                if entry.mtime_ns is not None:
                    os.utime(tmp, ns=(entry.mtime_ns, entry.mtime_ns))  # the rename keeps it
            staged.sort(key=lambda s: last is not None and last(s[2]))
            placed: list[Path] = []
            try:
                for tmp, dest, _ in staged:
                    if os.path.lexists(dest):
                        done.present += 1
                        continue
                    os.replace(tmp, dest)
                    placed.append(dest)
                    done.files += 1
                    done.bytes += dest.stat().st_size
            except OSError:
                for dest in placed:
                    dest.unlink(missing_ok=True)
                raise
            return done
        finally:
            for tmp, _, _ in staged:
                tmp.unlink(missing_ok=True)

    def _stage(self, cache: str, rel: str, entry: Entry, dest: Path) -> Path | None:
        """Copies the blob of ``entry`` to a temporary file beside ``dest`` while checking it;
        None (and a warning) when it is missing, not a regular file, or not the listed bytes."""
        blob = self.root / entry.sha256
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary_beside(dest)
        h = hashlib.sha256()
        try:
            if self.root.is_symlink():
                raise OSError(f"{self.root} is a symbolic link")
            with os.fdopen(open_regular(blob, entry.size), "rb") as src, open(tmp, "wb") as out:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            logger.warning("foundry: carried %s file %s not used (%s); the engine compiles its entry", cache, rel, exc)
            return None
        if h.hexdigest() != entry.sha256:
            tmp.unlink(missing_ok=True)
            logger.warning("foundry: carried %s file %s not used: its SHA-256 differs from %s; the engine compiles "
                           "its entry", cache, rel, self.list_path)
            return None
        return tmp


# The list's format and checks are the core's (foundry_core.cache_list); named here too for callers.
__all__ = ["ENABLE_ENV", "CACHES_DIR", "LIST_NAME", "LIST_FORMAT", "LIST_VERSION", "BLOB_NAME", "CacheTree",
           "HostCaches", "Copied", "Entry", "enabled", "file_digest", "is_temporary", "listed_blobs", "open_regular", "parse_list"]
