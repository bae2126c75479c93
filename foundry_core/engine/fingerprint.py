"""The engine part of an archive's fingerprint.

:func:`engine_fingerprint` turns what an engine adapter reports (engine, model configuration,
capture sizes, parallel sizes, dtype, graph knobs) into flat ``engine.*`` fields for
``save_graphs(..., fingerprint=...)`` / ``load_graphs(..., fingerprint=...)``, which add them to
the environment fingerprint (GPU, driver, CUDA, torch, Foundry) and compare them at LOAD.
:func:`explain_mismatch` says, field by field, why a saved fingerprint does not match.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from foundry_core.errors import InvalidArgumentError

PREFIX = "engine."
KNOB_PREFIX = PREFIX + "knob."
FIELDS_KEY = PREFIX + "fields"
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is split: tensor, pipeline, data and expert parallel sizes, and the number
    of ranks that each hold an archive (default tp * pp * dp)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    world_size: int = 0

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"parallel config {name} must be a positive integer, got {value!r}")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 0:
            raise InvalidArgumentError(f"parallel config world_size must be a positive integer, got "
                                       f"{self.world_size!r}")
        if self.world_size == 0:
            object.__setattr__(self, "world_size", self.tp * self.pp * self.dp)

    @classmethod
    def from_value(cls, value: ParallelConfig | Mapping[str, int]) -> ParallelConfig:
        """A ParallelConfig from itself or a mapping with keys among tp, pp, dp, ep, world_size."""
        if isinstance(value, ParallelConfig):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgumentError(f"parallel config must be a ParallelConfig or a mapping, got "
                                       f"{type(value).__name__}")
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown:
            raise InvalidArgumentError(f"parallel config: unknown key(s) {unknown}; the keys are "
                                       f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**value)


def _canonical(value: Any, path: str) -> Any:
    """``value`` as plain JSON types (tuples become lists); InvalidArgumentError naming the path of
    anything that has no stable JSON form (objects, sets, NaN, non-string keys)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgumentError(f"{path}: {value!r} has no stable JSON form")
    if isinstance(value, _SCALARS):
        # The exact base type: an IntEnum or str subclass would otherwise compare and print
        # differently from the plain value the archive stores.
        if value is None or type(value) in _SCALARS:
            return value
        if isinstance(value, str):
            return value.encode().decode()  # str() of a str-mixin enum may give "Class.MEMBER"
        return next(base(value) for base in (bool, int, float) if isinstance(value, base))
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidArgumentError(f"{path}: key {k!r} is not a string")
            out[k] = _canonical(v, f"{path}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise InvalidArgumentError(f"{path}: {type(value).__name__} value {value!r} is not JSON-able; pass plain "
                               "str/int/float/bool/None, lists and dicts")


def canonical_json(value: Any, what: str = "value") -> str:
    """The canonical JSON text of ``value`` (sorted keys, no spaces): equal data, equal text."""
    return json.dumps(_canonical(value, what), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of a model configuration; key order does not matter."""
    if not isinstance(config, Mapping):
        raise InvalidArgumentError(f"model identity must be a dict, got {type(config).__name__}")
    return hashlib.sha256(canonical_json(config, "model identity").encode()).hexdigest()


def _capture_sizes(sizes: Sequence[int]) -> list[int]:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise InvalidArgumentError(f"capture sizes must be a list of positive integers, got {sizes!r}")
    out = list(sizes)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in out):
        raise InvalidArgumentError(f"capture sizes must be positive integers, got {out!r}")
    return out


def _dtype(dtype: Any) -> str | None:
    if dtype is None:
        return None
    text = str(dtype)
    return text[len("torch."):] if text.startswith("torch.") else text


def engine_fingerprint(engine: str, engine_version: str, model: Mapping[str, Any], capture_sizes: Sequence[int],
                       parallel: ParallelConfig | Mapping[str, int], rank: int, dtype: Any = None,
                       knobs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The flat ``engine.*`` fingerprint fields: equal inputs give an equal dict.

    ``model`` is hashed (key order is irrelevant). ``capture_sizes`` keep their order (the order
    graphs are captured in shapes the memory layout). Each graph knob becomes its own field
    ``engine.knob.<name>`` (non-scalar values as canonical JSON), and ``engine.fields`` lists
    every field, so a knob added or removed between SAVE and LOAD is a mismatch too.
    """
    for name, value in (("engine", engine), ("engine version", engine_version)):
        if not isinstance(value, str) or not value:
            raise InvalidArgumentError(f"{name} must be a non-empty string, got {value!r}")
    par = ParallelConfig.from_value(parallel)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < par.world_size:
        raise InvalidArgumentError(f"rank {rank!r} is outside the world of {par.world_size} ranks")
    fp: dict[str, Any] = {
        PREFIX + "name": engine,
        PREFIX + "version": engine_version,
        PREFIX + "model_hash": config_hash(model),
        PREFIX + "capture_sizes": _capture_sizes(capture_sizes),
        PREFIX + "dtype": _dtype(dtype),
        PREFIX + "tp": par.tp,
        PREFIX + "pp": par.pp,
        PREFIX + "dp": par.dp,
        PREFIX + "ep": par.ep,
        PREFIX + "world_size": par.world_size,
        PREFIX + "rank": rank,
    }
    if knobs is not None and not isinstance(knobs, Mapping):
        raise InvalidArgumentError(f"graph knobs must be a dict, got {type(knobs).__name__}")
    for name in sorted(knobs or {}):
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"graph knob names must be non-empty strings, got {name!r}")
        value = _canonical(knobs[name], f"graph knob {name!r}")
        fp[KNOB_PREFIX + name] = value if isinstance(value, _SCALARS) else canonical_json(value)
    fp[FIELDS_KEY] = sorted(fp)
    return fp


def engine_fields(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The ``engine.*`` fields of a full fingerprint (as stored in a manifest)."""
    return {k: v for k, v in fingerprint.items() if k.startswith(PREFIX)}


_MISSING = object()


def _show(value: Any) -> str:
    if value is _MISSING:
        return "absent"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# At most this many differing entries are named inside one structured knob.
MAX_ENTRIES_SHOWN = 3


def _structured(value: Any) -> Any:
    """A knob stored as canonical JSON (a dict or list), parsed; anything else as is."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _differences(a: Any, b: Any, path: str) -> list[tuple[str, Any, Any]]:
    """(path, saved, now) of each leaf where ``a`` and ``b`` differ, dicts and lists descended."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in _differences(a.get(k, _MISSING), b.get(k, _MISSING), f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b and type(a) is type(b) else [(path, a, b)]


def _explain_field(key: str, a: Any, b: Any) -> str:
    """``key: saved A, now B``; for a structured knob (SGLang's whole graph configuration, say),
    the entries inside it that differ, which a cut-off JSON text would hide."""
    inner = _differences(_structured(a), _structured(b), "")
    if not isinstance(_structured(a), (dict, list)) or not inner or inner[0][0] == "":
        return f"{key}: saved {_show(a)}, now {_show(b)}"
    shown = ", ".join(f"{path}: saved {_show(x)}, now {_show(y)}" for path, x, y in inner[:MAX_ENTRIES_SHOWN])
    more = f" and {len(inner) - MAX_ENTRIES_SHOWN} more" if len(inner) > MAX_ENTRIES_SHOWN else ""
    return f"{key} differs at {shown}{more}"


def explain_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """One line per differing field: ``"engine.tp: saved 2, now 1"``; empty when they agree.
    A knob stored as JSON names the entries inside it that differ:
    ``"engine.knob.cfg differs at prefill.backend: saved 'breakable', now 'disabled'"``.

    Compares every field of either side except the ``engine.fields`` summary (the fields it
    lists are compared one by one).
    """
    lines = []
    for key in sorted((set(saved) | set(current)) - {FIELDS_KEY}):
        a, b = saved.get(key, _MISSING), current.get(key, _MISSING)
        if a != b or type(a) is not type(b):
            lines.append(_explain_field(key, a, b))
    return lines


def describe_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """:func:`explain_mismatch` as one line for a log, or None when the fingerprints agree."""
    lines = explain_mismatch(saved, current)
    return "; ".join(lines) if lines else None
