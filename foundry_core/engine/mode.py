"""The Foundry mode of an engine start: SAVE an archive, LOAD one, decide automatically, or stay off.

``auto`` (the default) means LOAD when a complete archive exists for this rank, SAVE otherwise.
Settings come from the engine's command line (``--foundry-mode``, ``--foundry-archive``) first,
then the environment (``FOUNDRY_MODE``, ``FOUNDRY_ARCHIVE``), then the defaults.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from foundry_core.engine.state import EngineState, read_state
from foundry_core.errors import ArchiveIOError, FormatError, FoundryError, InvalidArgumentError, NotFoundError
from foundry_core.manifest import MANIFEST_NAME, read_manifest

MODE_ENV = "FOUNDRY_MODE"
ARCHIVE_ENV = "FOUNDRY_ARCHIVE"
IMAGES_DIR = "images"


class Mode(enum.Enum):
    """AUTO: LOAD a complete archive, else SAVE. SAVE: capture and write. LOAD: restore. OFF: inactive."""

    AUTO = "auto"
    SAVE = "save"
    LOAD = "load"
    OFF = "off"

    def __str__(self) -> str:
        return self.value


CHOICES = tuple(m.value for m in Mode)


def parse_mode(value: Mode | str) -> Mode:
    """A Mode from a Mode or a user string (case-insensitive); InvalidArgumentError listing the choices."""
    if isinstance(value, Mode):
        return value
    if isinstance(value, str):
        try:
            return Mode(value.strip().lower())
        except ValueError:
            pass
    raise InvalidArgumentError(f"unknown Foundry mode {value!r}; choose one of {', '.join(CHOICES)}")


def check_complete(rank_dir: str | os.PathLike) -> None:
    """Raises unless ``rank_dir`` holds a complete rank archive (see :func:`read_complete`)."""
    read_complete(rank_dir)


def read_complete(rank_dir: str | os.PathLike) -> tuple[dict, EngineState]:
    """The manifest and the engine state of ``rank_dir`` if it holds a complete rank archive
    (read once: a LOAD checks them on its critical path); raises otherwise, naming what is wrong.

    Complete: manifest.json valid (foundry_core.manifest.read_manifest), its payload file and the
    images/ directory present, and a valid engine_state.json (written last by a SAVE, so its
    absence means the SAVE did not finish). NotFoundError when there is no archive at all,
    FormatError / VersionError when it is incomplete or corrupt.
    """
    d = Path(rank_dir)
    if not d.exists() and not d.is_symlink():
        raise NotFoundError(f"no archive at {d}")
    if d.is_symlink() or not d.is_dir():
        raise FormatError(f"{d} is not an archive directory")
    if not (d / MANIFEST_NAME).exists():
        raise FormatError(f"{d}: incomplete archive, {MANIFEST_NAME} is missing (an interrupted SAVE?)")
    try:
        manifest = read_manifest(d / MANIFEST_NAME)
    except ArchiveIOError as exc:
        raise FormatError(f"{d}: unreadable manifest ({exc})") from None
    payload = d / manifest["payload"]
    if payload.is_symlink() or not payload.is_file():
        raise FormatError(f"{d}: incomplete archive, the payload {manifest['payload']} is missing")
    images = d / IMAGES_DIR
    if images.is_symlink() or not images.is_dir():
        raise FormatError(f"{d}: incomplete archive, the {IMAGES_DIR}/ directory is missing")
    try:
        state = read_state(d)
    except ArchiveIOError:
        raise FormatError(f"{d}: incomplete archive, engine_state.json is missing (the SAVE did not finish)") \
            from None
    return manifest, state


def is_complete(rank_dir: str | os.PathLike) -> bool:
    """Whether ``rank_dir`` holds a complete rank archive (see :func:`check_complete`)."""
    try:
        check_complete(rank_dir)
    except (FoundryError, OSError):
        return False
    return True


def resolve_mode(requested: Mode | str, rank_dir: str | os.PathLike | None) -> Mode:
    """The mode this rank runs in: never AUTO.

    AUTO becomes LOAD when ``rank_dir`` holds a complete archive, otherwise SAVE (an incomplete or
    corrupt one is rewritten). An explicit LOAD of an incomplete, corrupt or missing archive raises
    the error of :func:`check_complete`. Without an archive directory, AUTO and OFF mean OFF and
    SAVE/LOAD raise InvalidArgumentError.
    """
    mode = parse_mode(requested)
    if mode is Mode.OFF:
        return Mode.OFF
    if rank_dir is None:
        if mode is Mode.AUTO:
            return Mode.OFF
        raise InvalidArgumentError(f"Foundry mode {mode} needs an archive: pass --foundry-archive DIR "
                                   f"or set {ARCHIVE_ENV}")
    if mode is Mode.SAVE:
        return Mode.SAVE
    if mode is Mode.LOAD:
        check_complete(rank_dir)
        return Mode.LOAD
    return Mode.LOAD if is_complete(rank_dir) else Mode.SAVE


@dataclass(frozen=True)
class Settings:
    """The requested mode and archive, and where each came from ("flag", "environment", "default")."""

    mode: Mode
    archive: Path | None
    mode_source: str
    archive_source: str


def _pick(flag: str | os.PathLike | Mode | None, env: Mapping[str, str], name: str) -> tuple[object, str]:
    if flag is not None and str(flag).strip():
        return flag, "flag"
    value = env.get(name, "").strip()
    if value:
        return value, "environment"
    return None, "default"


def resolve_settings(flag_mode: Mode | str | None = None, flag_archive: str | os.PathLike | None = None,
                     environ: Mapping[str, str] | None = None) -> Settings:
    """Combines the command line and the environment: flag > FOUNDRY_MODE/FOUNDRY_ARCHIVE > default.

    The default mode is AUTO; with no archive anywhere Foundry is OFF. An explicit save or load
    without an archive raises InvalidArgumentError saying how to give one.
    """
    env = os.environ if environ is None else environ
    raw_mode, mode_source = _pick(flag_mode, env, MODE_ENV)
    try:
        mode = parse_mode(raw_mode) if raw_mode is not None else Mode.AUTO
    except InvalidArgumentError as exc:
        where = "--foundry-mode" if mode_source == "flag" else MODE_ENV
        raise InvalidArgumentError(f"{where}: {exc}") from None
    raw_archive, archive_source = _pick(flag_archive, env, ARCHIVE_ENV)
    archive = Path(os.fspath(raw_archive)).expanduser() if raw_archive is not None else None
    if archive is None:
        if mode in (Mode.SAVE, Mode.LOAD):
            raise InvalidArgumentError(f"Foundry mode {mode} ({mode_source}) needs an archive: pass "
                                       f"--foundry-archive DIR or set {ARCHIVE_ENV}")
        mode = Mode.OFF
    return Settings(mode, archive, mode_source, archive_source)
