"""``engine_state.json``: what SAVE measured and LOAD reuses instead of measuring again.

LOAD skips the engine's memory profiling, so it must size the KV cache exactly as SAVE did; it
also needs the region placement and the scratch boundary SAVE sealed. The file sits in the rank's
archive directory and is written last, after the graphs: its presence marks a finished SAVE.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundry_core.archive_names import STATE_NAME
from foundry_core.engine.layout import atomic_write_json, read_json_file
from foundry_core.errors import FormatError, InvalidArgumentError

STATE_FORMAT = "foundry-engine-state"
STATE_VERSION = 1
_INT_FIELDS = ("kv_cache_bytes", "kv_cache_blocks", "region_base", "region_size", "region_high_water",
               "scratch_boundary")


@dataclass(frozen=True)
class EngineState:
    """The engine state recorded at SAVE.

    kv_cache_bytes / kv_cache_blocks: the KV cache SAVE allocated (LOAD allocates the same).
    region_base / region_size: the allocation region; region_high_water: its cursor's maximum.
    scratch_boundary: the offset :meth:`EngineSession.determinism_boundary` sealed at.
    capture_sizes: the batch sizes captured. adapter: the engine adapter's own JSON fields.
    """

    kv_cache_bytes: int
    kv_cache_blocks: int
    region_base: int
    region_size: int
    region_high_water: int
    scratch_boundary: int
    capture_sizes: tuple[int, ...] = ()
    adapter: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = _problem(self.to_json())
        if problem:
            raise InvalidArgumentError(f"engine state: {problem}")
        try:
            json.dumps(dict(self.adapter), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"engine state: 'adapter' is not JSON-serialisable ({exc})") from None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": STATE_FORMAT, "version": STATE_VERSION}
        out.update({k: getattr(self, k) for k in _INT_FIELDS})
        out["capture_sizes"] = list(self.capture_sizes) if isinstance(self.capture_sizes, (list, tuple)) \
            else self.capture_sizes
        out["adapter"] = dict(self.adapter) if isinstance(self.adapter, Mapping) else self.adapter
        return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _problem(data: Any) -> str | None:
    """What is wrong with a parsed state (naming the field), or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("format") != STATE_FORMAT:
        return f"'format' is {data.get('format')!r}, expected {STATE_FORMAT!r}"
    if data.get("version") != STATE_VERSION:
        return f"'version' is {data.get('version')!r}, this Foundry reads {STATE_VERSION}"
    known = {"format", "version", "capture_sizes", "adapter", *_INT_FIELDS}
    for key in sorted(set(data) - known):
        return f"unknown field {key!r}"
    for key in _INT_FIELDS:
        if key not in data:
            return f"missing {key!r}"
        if not _is_int(data[key]) or data[key] < 0:
            return f"{key!r} must be a non-negative integer, got {data[key]!r}"
    for key in ("region_high_water", "scratch_boundary"):
        if data[key] > data["region_size"]:
            return f"{key!r} ({data[key]}) lies beyond the region size ({data['region_size']})"
    sizes = data.get("capture_sizes")
    if not isinstance(sizes, list) or not all(_is_int(s) and s > 0 for s in sizes):
        return f"'capture_sizes' must be a list of positive integers, got {sizes!r}"
    adapter = data.get("adapter")
    if not isinstance(adapter, dict) or not all(isinstance(k, str) for k in adapter):
        return f"'adapter' must be a JSON object, got {type(adapter).__name__}"
    return None


def write_state(directory: str | os.PathLike, state: EngineState) -> Path:
    """Writes ``directory/engine_state.json`` atomically; returns its path."""
    path = Path(directory) / STATE_NAME
    atomic_write_json(path, state.to_json())
    return path


def read_state(directory: str | os.PathLike) -> EngineState:
    """Reads ``directory/engine_state.json``. ArchiveIOError when it is absent (the SAVE did not
    finish), FormatError naming the field when it is malformed."""
    path = Path(directory) / STATE_NAME
    data = read_json_file(path, STATE_NAME)
    problem = _problem(data)
    if problem:
        raise FormatError(f"{path}: {problem}")
    return EngineState(
        **{k: data[k] for k in _INT_FIELDS},
        capture_sizes=tuple(data["capture_sizes"]),
        adapter=data["adapter"],
    )
