"""The archive's list of carried cache files: its format, its checks, and reading the files it names.

Each rank lists the compile-cache files its start carried (``<archive>/rank<r>/host_caches.json``,
:data:`~foundry_core.archive_names.LIST_NAME`); the files themselves are stored once by content
(``<archive>/host_caches/<sha256>``). ``foundry verify`` (the core) checks both through this
module; the engine layer (:mod:`foundry_core.engine.host_caches`) writes and reads them.

::

    {"format": "foundry-host-caches", "version": 1,
     "caches": {"<cache>": {"<path in the cache>": {"size": 123, "sha256": "<64 hex digits>",
                                                    "mtime_ns": 1700000000123456789}}},
     "roots": {"<cache>": "<the cache's directory on the saving host>"}}

``mtime_ns`` (optional) is the file's modification time on the saving host, for caches whose
reader compares file times (ninja's): LOAD places the file with it. ``roots`` (optional) says where
each cache was on the saving host, for caches whose reader records absolute paths.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from foundry_core.archive_names import BLOB_NAME, LIST_NAME
from foundry_core.errors import FormatError
from foundry_core.manifest import parse_json, read_archive_file

__all__ = ["LIST_FORMAT", "LIST_VERSION", "MAX_LIST_BYTES", "CacheList", "Entry", "file_digest", "listed_blobs",
           "open_regular", "parse_list", "parse_roots", "read_list", "safe_path"]

LIST_FORMAT = "foundry-host-caches"
LIST_VERSION = 1
MAX_LIST_BYTES = 16 << 20
CHUNK = 1 << 20  # bytes read at a time when hashing or copying a carried file


@dataclass(frozen=True)
class Entry:
    """One carried file as the list names it: its size and the SHA-256 of its content (what names
    its stored copy), and the modification time it is placed with (None: the time of placing)."""

    size: int
    sha256: str
    mtime_ns: int | None = field(default=None, compare=False)

    @classmethod
    def of(cls, content: bytes, mtime_ns: int | None = None) -> Entry:
        return cls(len(content), hashlib.sha256(content).hexdigest(), mtime_ns)


def is_safe_path(path: str) -> bool:
    """Whether ``path`` is a relative path with no ``..``, ``.``, absolute part or empty component
    (so a PurePosixPath of it prints as ``path``). String checks only: a LOAD checks every
    carried file's path on the start's critical path."""
    return (bool(path) and not path.startswith("/") and "\\" not in path and "\0" not in path
            and all(part not in ("", ".", "..") for part in path.split("/")))


def safe_path(path: str) -> PurePosixPath | None:
    """``path`` as a relative path with no ``..``, absolute part or empty component, else None."""
    return PurePosixPath(path) if is_safe_path(path) else None


def open_regular(path: Path, expected_size: int | None = None) -> int:
    """A descriptor of ``path`` when it is a regular file (not a link, FIFO or device; of
    ``expected_size`` bytes when given), else OSError naming why."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (expected_size is not None and st.st_size != expected_size):
        os.close(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else \
            f"{st.st_size} bytes, the list says {expected_size}"
        raise OSError(f"{path}: {why}")
    return fd


def file_digest(path: Path) -> Entry:
    """Size and SHA-256 of a regular file (OSError for anything else)."""
    h = hashlib.sha256()
    size = 0
    with os.fdopen(open_regular(path), "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return Entry(size, h.hexdigest())


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
        if not isinstance(cache, str) or not is_safe_path(cache) or "/" in cache or not isinstance(files, dict):
            raise FormatError(f"{path}: cache {cache!r} is not a plain name with an object of files")
        for rel, entry in files.items():
            if not is_safe_path(rel):
                raise FormatError(f"{path}: {cache} path {rel!r} is not a relative path inside the archive")
            if not isinstance(entry, dict) or not _count(entry.get("size")) \
                    or not isinstance(entry.get("sha256"), str) or not BLOB_NAME.fullmatch(entry["sha256"]):
                raise FormatError(f"{path}: {cache}/{rel} needs a size and a sha256 (64 lowercase hex digits)")
            if entry.get("mtime_ns") is not None and not _count(entry["mtime_ns"]):
                raise FormatError(f"{path}: {cache}/{rel} has an 'mtime_ns' that is not a non-negative integer")
            out.setdefault(cache, {})[rel] = Entry(entry["size"], entry["sha256"], entry.get("mtime_ns"))
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_roots(data: Any, path: Path) -> dict[str, str]:
    """The list's ``roots`` (cache -> its directory on the saving host), checked; {} when absent."""
    roots = data.get("roots", {}) if isinstance(data, dict) else {}
    if not isinstance(roots, dict) or not all(isinstance(k, str) and isinstance(v, str) and v.startswith("/")
                                              for k, v in roots.items()):
        raise FormatError(f"{path}: 'roots' is not an object of cache names and absolute paths")
    return dict(roots)


@dataclass
class CacheList:
    """A rank's list as read: the carried files of each cache, and where each cache was at SAVE."""

    entries: dict[str, dict[str, Entry]]
    roots: dict[str, str]


def read_list(path: Path) -> CacheList:
    """A rank's list read from ``path`` and checked: ArchiveIOError when it cannot be read,
    FormatError when it is a link, too large, not JSON or not a valid list."""
    data = parse_json(read_archive_file(path, LIST_NAME, MAX_LIST_BYTES), str(path), LIST_NAME)
    return CacheList(parse_list(data, path), parse_roots(data, path))


def listed_blobs(lists: Iterable[Path]) -> dict[str, Entry]:
    """Every carried file the ranks' lists name, by SHA-256; FormatError for a bad list."""
    out: dict[str, Entry] = {}
    for path in lists:
        for files in read_list(path).entries.values():
            for entry in files.values():
                if out.setdefault(entry.sha256, entry) != entry:
                    raise FormatError(f"{path}: {entry.sha256} is listed with two sizes")
    return out
