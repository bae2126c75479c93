"""The outputs of a decode graph: flattened to tensors at SAVE, rebuilt around restored tensors at LOAD.

``FullCudaGraphBackend`` keeps, per shape, what the captured forward returned and hands it back
from ``replay``. For decode that is a ``LogitsProcessorOutput`` (a dataclass) whose
``next_token_logits`` aliases the shared logits buffer the graph copies into (``hidden_states``
and the rest are None unless hidden states or logprobs are captured). An archive stores only
tensors, so SAVE records a *layout* (the dataclass's import path, which fields are tensors, and
the plain values of the others) next to the tensors, and LOAD rebuilds the same object from the
restored tensors (which alias the same device memory as at SAVE).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from foundry_core.engine.capture import is_cuda_tensor
from foundry_core.errors import MismatchError, UnsupportedError

_SCALARS = (bool, int, float, str)


def flatten(out: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(tensors, layout) of a captured forward's result: a CUDA tensor, a tuple or list of them, or
    a dataclass whose fields are CUDA tensors, None or plain scalars. UnsupportedError naming the
    field otherwise (the graph's output could not be restored)."""
    if is_cuda_tensor(out):
        return (out,), {"kind": "tensor"}
    if isinstance(out, (tuple, list)) and all(is_cuda_tensor(t) for t in out):
        return tuple(out), {"kind": type(out).__name__}
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        cls = type(out)
        tensors: list[Any] = []
        names: list[str] = []
        values: dict[str, Any] = {}
        for f in dataclasses.fields(out):
            value = getattr(out, f.name)
            if is_cuda_tensor(value):
                names.append(f.name)
                tensors.append(value)
            elif value is None or isinstance(value, _SCALARS):
                values[f.name] = value
            else:
                raise UnsupportedError(f"the decode graph output {cls.__name__}.{f.name} is a {type(value).__name__}; "
                                       "only CUDA tensors, None and scalars can be restored")
        return tuple(tensors), {"kind": "dataclass", "type": f"{cls.__module__}:{cls.__qualname__}",
                                "tensors": names, "values": values}
    raise UnsupportedError(f"the decode graph output is a {type(out).__name__}; expected a tensor, a tuple of tensors "
                           "or a dataclass")


def _import(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def rebuild(layout: Any, tensors: Any) -> Any:
    """The object ``flatten`` described, around ``tensors`` (an archive's restored outputs).
    MismatchError when the layout does not fit them or this SGLang's class."""
    items = tuple(tensors) if isinstance(tensors, (tuple, list)) else (tensors,)
    if not isinstance(layout, dict) or "kind" not in layout:
        raise MismatchError(f"the archive records no output layout ({layout!r})")
    kind = layout["kind"]
    if kind == "tensor" and len(items) == 1:
        return items[0]
    if kind in ("tuple", "list"):
        return tuple(items) if kind == "tuple" else list(items)
    if kind == "dataclass":
        names = list(layout.get("tensors", []))
        if len(names) != len(items):
            raise MismatchError(f"the archive holds {len(items)} output tensors, its layout names {len(names)}")
        try:
            cls = _import(str(layout["type"]))
            return cls(**dict(zip(names, items)), **dict(layout.get("values", {})))
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise MismatchError(f"cannot rebuild the decode graph output {layout.get('type')} ({exc})") from None
    raise MismatchError(f"output layout {kind!r} does not fit {len(items)} tensors")
