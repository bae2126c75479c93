"""manifest.json: the human-readable index of an archive (format version, fingerprint, region,
graphs and their outputs, payload and log files). Read strictly: anything malformed is a
FormatError naming the field, never a KeyError or a silently wrong value."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundry_core.errors import ArchiveIOError, FormatError, VersionError

FORMAT_NAME = "foundry-archive"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
          "float8_e4m3fn", "float8_e5m2")


def _require(obj: dict, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise FormatError(f"{where}: missing {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise FormatError(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _check_name(name: str, where: str) -> str:
    # Names come from the archive: they may only name a file inside it.
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise FormatError(f"{where}: {name!r} is not a plain file name inside the archive")
    return name


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_tensor(t: Any, where: str) -> None:
    _require(t, "ptr", int, where)
    shape = _require(t, "shape", list, where)
    stride = _require(t, "stride", list, where)
    dtype = _require(t, "dtype", str, where)
    if dtype not in DTYPES:
        raise FormatError(f"{where}: unknown dtype {dtype!r}")
    if len(shape) != len(stride) or not all(_is_int(x) for x in shape + stride) or any(x < 0 for x in shape):
        raise FormatError(f"{where}: shape {shape} and stride {stride} do not describe a tensor")


_DTYPE_SET = frozenset(DTYPES)
_OUTPUT_COUNTS = {"none": 0, "tensor": 1, "list": None, "tuple": None}  # output kind -> tensors (None: any)


def _tensor_ok(t: Any) -> bool:
    """Whether ``t`` passes :func:`_check_tensor`, without building its messages: a LOAD checks
    thousands of them on the start's critical path (JSON ints are exactly ``int``, never bool)."""
    if type(t) is not dict:
        return False
    shape, stride, dtype = t.get("shape"), t.get("stride"), t.get("dtype")
    return (type(t.get("ptr")) is int and type(shape) is list and type(stride) is list
            and type(dtype) is str and dtype in _DTYPE_SET and len(shape) == len(stride)
            and all(type(x) is int and x >= 0 for x in shape) and all(type(x) is int for x in stride))


def _graph_ok(g: Any) -> bool:
    """Whether graph entry ``g`` passes validate()'s checks (the fast path; the slow one names
    what is wrong)."""
    if type(g) is not dict or type(g.get("name")) is not str:
        return False
    outputs = g.get("outputs")
    kind = outputs.get("kind") if type(outputs) is dict else None
    if type(kind) is not str or kind not in _OUTPUT_COUNTS:
        return False
    tensors = outputs.get("tensors")
    expected = _OUTPUT_COUNTS[kind]
    return (type(tensors) is list and (expected is None or len(tensors) == expected)
            and all(_tensor_ok(t) for t in tensors))


def validate(manifest: Any, source: str = MANIFEST_NAME) -> dict:
    """Checks a parsed manifest's structure; returns it."""
    if not isinstance(manifest, dict):
        raise FormatError(f"{source}: not a JSON object")
    fmt = _require(manifest, "format", str, source)
    if fmt != FORMAT_NAME:
        raise FormatError(f"{source}: not a Foundry archive manifest (format {fmt!r})")
    version = _require(manifest, "version", int, source)
    if version != FORMAT_VERSION:
        raise VersionError(f"{source}: archive format version {version}, this Foundry reads {FORMAT_VERSION}")
    _require(manifest, "fingerprint", dict, source)
    _check_name(_require(manifest, "payload", str, source), source)
    if "log" in manifest:
        _check_name(_require(manifest, "log", str, source), source)
    region = _require(manifest, "region", dict, source)
    for key in ("base", "size", "high_water"):
        _require(region, key, int, f"{source} region")
    graphs = _require(manifest, "graphs", list, source)
    for i, g in enumerate(graphs):
        if _graph_ok(g):
            continue
        where = f"{source} graph {i}"
        _require(g, "name", str, where)
        outputs = _require(g, "outputs", dict, where)
        kind = _require(outputs, "kind", str, where)
        if kind not in _OUTPUT_COUNTS:
            raise FormatError(f"{where}: unknown output kind {kind!r}")
        tensors = _require(outputs, "tensors", list, where)
        expected = _OUTPUT_COUNTS[kind]
        if expected is not None and len(tensors) != expected:
            raise FormatError(f"{where}: outputs of kind {kind!r} must hold {expected} tensor(s), not {len(tensors)}")
        for t in tensors:
            _check_tensor(t, where + " output")
    return manifest


def read_archive_file(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of a plain file of an archive: symlinks, directories, FIFOs and oversized files
    are refused (a FIFO would block the reader forever)."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise ArchiveIOError(f"{p}: no such {what} (is this a complete Foundry archive?)") from None
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(f"{p}: the {what} is a symbolic link; archives must be plain files")
    if not stat.S_ISREG(st.st_mode):
        raise ArchiveIOError(f"{p}: the {what} is not a regular file")
    if st.st_size > max_bytes:
        raise FormatError(f"{p}: {what} of {st.st_size} bytes is larger than the {max_bytes} allowed")
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes + 1)


def parse_json(data: bytes, source: str, what: str) -> Any:
    """JSON from archive bytes; anything unreadable is a FormatError naming the file."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise FormatError(f"{source}: {what} is not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


def read_manifest(path: str | os.PathLike) -> dict:
    """Reads and validates a manifest file (refusing symlinks, non-regular and oversized files)."""
    data = read_archive_file(path, "manifest", MAX_MANIFEST_BYTES)
    return validate(parse_json(data, str(path), "manifest"), str(path))


def file_identity(path: str | os.PathLike) -> tuple[int, ...] | None:
    """(device, inode, size, mtime_ns, ctime_ns) of ``path`` itself (a symbolic link is not
    followed: reads refuse one), or None when it cannot be had. An archive's files are replaced
    by renaming a new directory into place, which changes the inode."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass(frozen=True)
class KnownManifest:
    """A manifest already read and validated, with its file's :func:`file_identity` taken before
    that read: while the file keeps it, the file still holds what was read, and a LOAD that reads
    the manifest again (the restore, the images thread) uses this instead (0.03-0.1 s of parsing
    and checks for a few thousand graphs)."""

    path: Path
    identity: tuple[int, ...]
    manifest: dict

    def current(self, path: str | os.PathLike) -> dict | None:
        """The manifest when ``path`` is its file and still unchanged, else None (read it again)."""
        if Path(path) != self.path or file_identity(path) != self.identity:
            return None
        return self.manifest


def write_manifest(path: str | os.PathLike, manifest: dict) -> None:
    """Writes a manifest atomically (temporary file, fsync, rename)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
