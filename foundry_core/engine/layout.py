"""Where an engine's archive lives on disk: one directory per global rank, plus ``engine.json``.

::

    <archive>/engine.json      engine name/version, world size, parallel sizes (written once)
    <archive>/rank0/           rank 0's graph archive (manifest.json, graphs.fgr, images/, ...)
                  engine_state.json   the engine state recorded at SAVE (see state.py)
    <archive>/rank1/ ...

A LOAD needs the topology of the SAVE: the same engine, world size and parallel sizes.
:func:`check_topology` refuses anything else, naming both sides.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from foundry_core.archive_names import ENGINE_INFO_NAME
from foundry_core.errors import ArchiveIOError, FormatError, InvalidArgumentError, MismatchError

ENGINE_INFO_FORMAT = "foundry-engine"
ENGINE_INFO_VERSION = 1
RANK_PREFIX = "rank"
MAX_JSON_BYTES = 16 << 20


def rank_dir(archive: str | os.PathLike, rank: int) -> Path:
    """The directory of global rank ``rank`` inside ``archive``: ``<archive>/rank<rank>``."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise InvalidArgumentError(f"rank must be a non-negative integer, got {rank!r}")
    return Path(archive) / f"{RANK_PREFIX}{rank}"


@dataclass(frozen=True)
class Topology:
    """What every rank of one SAVE shares: the engine and how the model is split over GPUs."""

    engine: str
    engine_version: str
    world_size: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("engine", "engine_version"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidArgumentError(f"topology {name} must be a non-empty string, got {getattr(self, name)!r}")
        for name in ("world_size", "tp", "pp", "dp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"topology {name} must be a positive integer, got {value!r}")

    def describe(self) -> str:
        return (f"{self.engine} {self.engine_version} with world_size={self.world_size}, tp={self.tp}, "
                f"pp={self.pp}, dp={self.dp}, ep={self.ep}")


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    """Writes ``data`` as JSON to ``path`` atomically: a temporary file beside it, fsync, rename,
    then fsync of the directory. Readers see the old file or the new one, never a partial one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json_file(path: str | os.PathLike, what: str) -> Any:
    """Parses a small JSON file of an archive; ArchiveIOError when absent, FormatError when the
    file is a symbolic link, too large or not JSON. ``what`` names the file in messages."""
    p = Path(path)
    if p.is_symlink():
        raise FormatError(f"{p}: {what} is a symbolic link; archives hold plain files")
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise ArchiveIOError(f"{p}: no {what}") from None
    if size > MAX_JSON_BYTES:
        raise FormatError(f"{p}: {what} of {size} bytes is larger than the {MAX_JSON_BYTES} allowed")
    try:
        return json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{p}: {what} is not valid JSON ({exc})") from None
    except OSError as exc:
        raise ArchiveIOError(f"{p}: cannot read {what} ({exc})") from None


def write_topology(archive: str | os.PathLike, topology: Topology) -> bool:
    """Writes ``<archive>/engine.json`` unless it already holds ``topology``; returns whether it
    wrote. Every rank may call it: identical content makes the concurrent writes harmless."""
    path = Path(archive) / ENGINE_INFO_NAME
    try:
        if read_topology(archive) == topology:
            return False
    except (ArchiveIOError, FormatError):
        pass
    atomic_write_json(path, {"format": ENGINE_INFO_FORMAT, "version": ENGINE_INFO_VERSION, **asdict(topology)})
    return True


def read_topology(archive: str | os.PathLike) -> Topology:
    """The topology recorded in ``<archive>/engine.json``; FormatError naming the bad field."""
    path = Path(archive) / ENGINE_INFO_NAME
    data = read_json_file(path, ENGINE_INFO_NAME)
    if not isinstance(data, dict):
        raise FormatError(f"{path}: not a JSON object")
    if data.get("format") != ENGINE_INFO_FORMAT:
        raise FormatError(f"{path}: 'format' is {data.get('format')!r}, expected {ENGINE_INFO_FORMAT!r}")
    if data.get("version") != ENGINE_INFO_VERSION:
        raise FormatError(f"{path}: 'version' is {data.get('version')!r}, this Foundry reads {ENGINE_INFO_VERSION}")
    fields = {k: v for k, v in data.items() if k not in ("format", "version")}
    expected = set(Topology.__dataclass_fields__)
    for key in sorted(expected - set(fields)):
        raise FormatError(f"{path}: missing {key!r}")
    for key in sorted(set(fields) - expected):
        raise FormatError(f"{path}: unknown field {key!r}")
    try:
        return Topology(**fields)
    except InvalidArgumentError as exc:
        raise FormatError(f"{path}: {exc}") from None


def check_topology(archive: str | os.PathLike, current: Topology) -> Topology:
    """Refuses (MismatchError naming both) an archive saved with another engine or topology;
    returns the archive's topology when it matches ``current``."""
    saved = read_topology(archive)
    if saved != current:
        differing = [f"{k} {getattr(saved, k)!r} vs {getattr(current, k)!r}"
                     for k in Topology.__dataclass_fields__ if getattr(saved, k) != getattr(current, k)]
        raise MismatchError(
            f"archive {archive} was saved by {saved.describe()}; this engine runs {current.describe()} "
            f"({', '.join(differing)}): LOAD needs the engine release and topology of the SAVE")
    return saved
