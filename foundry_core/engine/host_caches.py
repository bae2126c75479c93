"""Host caches carried in the archive: the compiled code an engine start reads from caches on the
host (Triton's kernel cache, the engine's torch.compile cache), so that LOAD on a fresh host (a new
node, a new container) does not compile it again.

::

    <archive>/host_caches/<cache>/<path>   the files (shared by the ranks)
    <archive>/rank<r>/host_caches.json     rank r's list: cache -> {path: {size, sha256}}

Both caches key their entries by content (hashes of source, compiler and GPU in the directory
names), so a path names the same bytes on every host with the same software, and ranks that carry
the same file write it once. SAVE adds the files after the engine's warmup (the graphs are already
complete: a start that dies here leaves a usable archive without caches). LOAD copies a listed file
into the host's cache only where the host lacks it, after checking its size and SHA-256 against the
list; when one does not match, none of its tree (a Triton kernel, vLLM's compile directory) is
copied and a warning names it: the engine compiles that entry itself, as a start without the
archive does. Every copy is a temporary file renamed into
place, so a reader of the host's cache (another process starting beside this one) never sees a
partial file. ``FOUNDRY_HOST_CACHES=0`` turns carrying off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from foundry_core.engine import options
from foundry_core.engine.layout import atomic_write_json, read_json_file
from foundry_core.errors import ArchiveIOError, FormatError

logger = logging.getLogger("foundry")

ENABLE_ENV = "FOUNDRY_HOST_CACHES"
CACHES_DIR = "host_caches"
LIST_NAME = "host_caches.json"
LIST_FORMAT = "foundry-host-caches"
LIST_VERSION = 1
_CHUNK = 1 << 20


def enabled(environ: Any = None) -> bool:
    """Whether starts carry host caches in the archive (FOUNDRY_HOST_CACHES, default on)."""
    return options.env_flag(ENABLE_ENV, environ=environ)


@dataclass(frozen=True)
class CacheTree:
    """A cache an engine reads compiled code from, other than Triton's: ``cache`` names it in the
    archive, ``root`` is its directory on this host, ``used`` the directories under ``root`` this
    start used (what SAVE carries), ``keep(path)`` leaves files out (another rank's)."""

    cache: str
    root: Path
    used: tuple[str, ...] = ()
    keep: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class Entry:
    size: int
    sha256: str


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


def _safe_path(path: str) -> PurePosixPath | None:
    """``path`` as a relative path with no ``..``, absolute part or empty component, else None."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or any(part in ("", ".", "..") for part in p.parts) or "\\" in path \
            or "\0" in path or str(p) != path:
        return None
    return p


def file_digest(path: Path) -> Entry:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return Entry(size, h.hexdigest())


def write_new(target: Path, content: bytes) -> bool:
    """Writes ``content`` to ``target`` unless it exists: a temporary file beside it, then a
    rename (readers never see a partial file; of two writers, the first keeps its file). Returns
    whether this call wrote it."""
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_bytes(content)
        if target.exists():
            return False
        os.replace(tmp, target)
        return True
    finally:
        tmp.unlink(missing_ok=True)


class HostCaches:
    """One rank's carried caches: what SAVE adds (:meth:`add_tree`, then :meth:`write_list`) and
    what LOAD copies back (:meth:`read`, then :meth:`restore_tree`)."""

    def __init__(self, archive: str | os.PathLike, rank_dir: str | os.PathLike) -> None:
        self.root = Path(archive) / CACHES_DIR
        self.list_path = Path(rank_dir) / LIST_NAME
        self.entries: dict[str, dict[str, Entry]] = {}

    # ---- SAVE ----------------------------------------------------------------------------------

    def add_tree(self, cache: str, source: str | os.PathLike, sub: str = "",
                 rewrite: Callable[[str, bytes], bytes] | None = None,
                 keep: Callable[[str], bool] | None = None) -> Copied:
        """Adds every file under ``source/sub`` to cache ``cache`` at its path relative to
        ``source``, except those whose path ``keep`` refuses. ``rewrite(path, content)`` may change
        a file's bytes before they are stored (e.g. an absolute path of this host inside it).
        Files that vanish while walked are left out."""
        base = Path(source)
        done = Copied()
        top = base / sub if sub else base
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith("tmp.")]  # a writer's unfinished files
            for name in filenames:
                path = Path(dirpath, name)
                rel = path.relative_to(base).as_posix()
                if (name.startswith(".") and ".tmp." in name) or path.is_symlink() or _safe_path(rel) is None \
                        or (keep is not None and not keep(rel)):
                    continue
                try:
                    content = path.read_bytes()
                except OSError:
                    continue
                if rewrite is not None:
                    content = rewrite(rel, content)
                self._store(cache, rel, content, done)
        return done

    def _store(self, cache: str, rel: str, content: bytes, done: Copied) -> None:
        entry = Entry(len(content), hashlib.sha256(content).hexdigest())
        target = self.root / cache / rel
        if write_new(target, content):
            done.files += 1
            done.bytes += entry.size
        elif file_digest(target) == entry:
            done.present += 1
        else:  # another rank's different bytes under the same key: keep theirs, list none
            logger.warning("foundry: %s/%s in the archive differs from this host's; not carried", cache, rel)
            done.refused += 1
            return
        self.entries.setdefault(cache, {})[rel] = entry

    def write_list(self) -> None:
        """Writes this rank's list (atomically); the carried files are usable from then on."""
        atomic_write_json(self.list_path, {
            "format": LIST_FORMAT, "version": LIST_VERSION,
            "caches": {cache: {rel: {"size": e.size, "sha256": e.sha256} for rel, e in sorted(files.items())}
                       for cache, files in sorted(self.entries.items())}})

    # ---- LOAD ----------------------------------------------------------------------------------

    @classmethod
    def read(cls, archive: str | os.PathLike, rank_dir: str | os.PathLike) -> HostCaches | None:
        """This rank's carried caches, or None when the archive carries none. A list that cannot
        be read is logged and treated as none (the start compiles, as without the archive)."""
        caches = cls(archive, rank_dir)
        if not caches.list_path.exists() and not caches.list_path.is_symlink():
            return None
        try:
            caches.entries = parse_list(read_json_file(caches.list_path, LIST_NAME), caches.list_path)
        except (ArchiveIOError, FormatError) as exc:
            logger.warning("foundry: the archive's host caches are not used: %s", exc)
            return None
        return caches

    def paths(self, cache: str, prefix: str = "") -> list[str]:
        """The carried paths of ``cache`` under directory ``prefix`` ("" for all)."""
        start = prefix.rstrip("/") + "/" if prefix else ""
        return [rel for rel in self.entries.get(cache, {}) if rel.startswith(start)]

    def restore_tree(self, cache: str, target: str | os.PathLike, prefix: str = "", *, strip: bool = False,
                     rewrite: Callable[[str, bytes], bytes] | None = None) -> Copied:
        """Copies the carried files of ``cache`` under ``prefix`` that ``target`` lacks into it, at
        their paths (``strip``: relative to ``prefix``). All or nothing: when one file's size or
        SHA-256 differs from the list, none is copied (a compiled entry missing a part would
        not load) and a warning names it. ``rewrite(path, content)`` adapts a file to this host."""
        done = Copied()
        wanted: list[tuple[Path, str, bytes]] = []
        cut = len(prefix.rstrip("/")) + 1 if strip and prefix else 0
        for rel in self.paths(cache, prefix):
            dest = Path(target) / rel[cut:]
            if dest.exists():
                done.present += 1
                continue
            content = self._verified(cache, rel, self.root / cache / rel)
            if content is None:
                done.refused += len(self.paths(cache, prefix)) - done.present
                return done
            wanted.append((dest, rel[cut:], content))
        for dest, dest_rel, content in wanted:
            if rewrite is not None:
                content = rewrite(dest_rel, content)
            if write_new(dest, content):
                done.files += 1
                done.bytes += len(content)
            else:
                done.present += 1
        return done

    def _verified(self, cache: str, rel: str, source: Path) -> bytes | None:
        expected = self.entries[cache][rel]
        try:
            if source.is_symlink():
                raise OSError("a symbolic link")
            content = source.read_bytes()
        except OSError as exc:
            logger.warning("foundry: carried %s file %s not used: %s", cache, rel, exc)
            return None
        if len(content) != expected.size or hashlib.sha256(content).hexdigest() != expected.sha256:
            logger.warning("foundry: carried %s file %s not used: its size or SHA-256 differs from %s (%d bytes, "
                           "expected %d)", cache, rel, self.list_path, len(content), expected.size)
            return None
        return content


def parse_list(data: Any, path: Path) -> dict[str, dict[str, Entry]]:
    """A rank's list, checked: FormatError naming the first bad field."""
    if not isinstance(data, dict) or data.get("format") != LIST_FORMAT:
        raise FormatError(f"{path}: not a {LIST_FORMAT} file")
    if data.get("version") != LIST_VERSION:
        raise FormatError(f"{path}: 'version' is {data.get('version')!r}, this Foundry reads {LIST_VERSION}")
    caches = data.get("caches")
    if not isinstance(caches, dict):
        raise FormatError(f"{path}: 'caches' is not an object")
    out: dict[str, dict[str, Entry]] = {}
    for cache, files in caches.items():
        if _safe_path(cache) is None or "/" in cache or not isinstance(files, dict):
            raise FormatError(f"{path}: cache {cache!r} is not a plain name with an object of files")
        for rel, entry in files.items():
            if _safe_path(rel) is None:
                raise FormatError(f"{path}: {cache} path {rel!r} is not a relative path inside the archive")
            if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or entry["size"] < 0 \
                    or not isinstance(entry.get("sha256"), str) or len(entry["sha256"]) != 64:
                raise FormatError(f"{path}: {cache}/{rel} needs a size and a sha256")
            out.setdefault(cache, {})[rel] = Entry(entry["size"], entry["sha256"])
    return out


def carried_files(archive: Path, lists: Iterable[Path]) -> dict[str, Entry]:
    """Every file the ranks' lists name, as ``cache/path``; FormatError for a bad list or two
    lists that disagree on a file."""
    out: dict[str, Entry] = {}
    for path in lists:
        for cache, files in parse_list(read_json_file(path, LIST_NAME), path).items():
            for rel, entry in files.items():
                name = f"{cache}/{rel}"
                if out.setdefault(name, entry) != entry:
                    raise FormatError(f"{path}: {name} is listed with another size or SHA-256 by another rank")
    return out


__all__ = ["ENABLE_ENV", "CACHES_DIR", "LIST_NAME", "CacheTree", "HostCaches", "Copied", "Entry", "enabled", "file_digest",
           "carried_files", "parse_list", "write_new"]
