"""Plain values for fingerprints: engine settings as JSON data whose text is the same in every run.

An engine adapter reports model identity and graph knobs from the engine's configuration objects
(dataclasses, pydantic models, enums, dtypes, sets). :func:`plain` turns them into JSON-able
data that :func:`~foundry_core.engine.fingerprint.engine_fingerprint` can hash and compare: no
memory addresses, no set order, no NaN.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_DEPTH", "MODEL_DUMPS", "plain"]

MAX_DEPTH = 8          # deeper values are reported by their type name only
MODEL_DUMPS = ("model_dump",)  # pydantic; msgspec-like configs also have "to_dict"


def plain(value: Any, depth: int = 0, *, dumps: tuple[str, ...] = MODEL_DUMPS) -> Any:
    """``value`` as JSON-able data with a stable text:

    - enums (IntEnum and StrEnum too) by member name; None, bools, ints and strings as they are;
    - floats as they are, NaN and infinities as their ``str`` (``"nan"``, ``"inf"``);
    - mappings as dicts with ``str`` keys, lists and tuples as lists, sets sorted (by ``repr`` of
      their plain items), dataclasses as dicts of their fields;
    - objects with one of the methods named in ``dumps`` (default ``model_dump``: pydantic models)
      as the plain form of what it returns (the next one is tried when it raises);
    - anything else (dtypes, devices) as its ``str``, or only its type name when that ``str``
      holds a memory address (`` at 0x``), as does anything nested deeper than :data:`MAX_DEPTH`.
    """
    if depth > MAX_DEPTH:
        return type(value).__name__
    if isinstance(value, enum.Enum):  # before int/str: IntEnum and StrEnum are both
        return value.name
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1, dumps=dumps) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1, dumps=dumps) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v, depth + 1, dumps=dumps) for v in value), key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name, None), depth + 1, dumps=dumps) for f in dataclasses.fields(value)}
    for dump in dumps:
        method = getattr(value, dump, None)
        if callable(method):
            try:
                return plain(method(), depth + 1, dumps=dumps)
            except Exception:  # noqa: BLE001 - fall through to the text form
                pass
    text = str(value)
    return type(value).__name__ if " at 0x" in text else text
