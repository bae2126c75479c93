"""The outputs of a decode graph: flattened to tensors at SAVE, rebuilt around restored tensors at LOAD.

``CUDAGraphRunner.capture`` keeps ``make_weak_ref(output)`` per key: non-owning views of what the
captured forward returned, pointing into the graph pool. For TensorRT-LLM's decode forward that is
a dict of tensors (``{"logits": ...}``, more keys with some models), a tensor, or a tuple or list
of them; entries may be None. An archive stores only tensors, so SAVE records a *layout* (the
container and where each tensor goes) beside the tensors, and LOAD rebuilds the same container
from the restored tensors, which alias the same device memory as at SAVE (so they are views of
memory the archive owns, as the captured outputs were views of the pool).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from foundry_core.engine.capture import is_cuda_tensor
from foundry_core.errors import MismatchError, UnsupportedError

__all__ = ["flatten", "rebuild"]


def _entry(value: Any, where: str, tensors: list[Any]) -> Any:
    """The layout of one entry: its tensor's index, None, or UnsupportedError naming ``where``."""
    if value is None:
        return None
    if is_cuda_tensor(value):
        tensors.append(value)
        return len(tensors) - 1
    raise UnsupportedError(f"the decode graph output {where} is a {type(value).__name__}; only CUDA tensors and None "
                           "can be restored")


def flatten(out: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(tensors, layout) of a captured forward's outputs: a CUDA tensor, a tuple or list of CUDA
    tensors and None, or a dict of them with string keys. UnsupportedError naming the entry
    otherwise (the graph's outputs could not be restored)."""
    tensors: list[Any] = []
    if is_cuda_tensor(out):
        return (out,), {"kind": "tensor"}
    if isinstance(out, Mapping):
        if not all(isinstance(k, str) for k in out):
            raise UnsupportedError("the decode graph outputs are a dict with non-string keys")
        items = {k: _entry(v, f"[{k!r}]", tensors) for k, v in out.items()}
        return tuple(tensors), {"kind": "dict", "items": items}
    if isinstance(out, (tuple, list)):
        items_list = [_entry(v, f"[{i}]", tensors) for i, v in enumerate(out)]
        return tuple(tensors), {"kind": type(out).__name__, "items": items_list}
    raise UnsupportedError(f"the decode graph outputs are a {type(out).__name__}; expected a tensor, a tuple, list or "
                           "dict of tensors")


def _pick(index: Any, items: tuple[Any, ...]) -> Any:
    if index is None:
        return None
    if not isinstance(index, int) or not 0 <= index < len(items):
        raise MismatchError(f"the output layout names tensor {index!r}, the archive holds {len(items)}")
    return items[index]


def rebuild(layout: Any, tensors: Any) -> Any:
    """The container ``flatten`` described, around ``tensors`` (an archive's restored outputs).
    MismatchError when the layout does not fit them."""
    items = tuple(tensors) if isinstance(tensors, (tuple, list)) else (tensors,)
    if not isinstance(layout, Mapping) or "kind" not in layout:
        raise MismatchError(f"the archive records no output layout ({layout!r})")
    kind = layout["kind"]
    if kind == "tensor" and len(items) == 1:
        return items[0]
    if kind == "dict" and isinstance(layout.get("items"), Mapping):
        return {k: _pick(i, items) for k, i in layout["items"].items()}
    if kind in ("tuple", "list") and isinstance(layout.get("items"), list):
        values = [_pick(i, items) for i in layout["items"]]
        return tuple(values) if kind == "tuple" else values
    raise MismatchError(f"output layout {kind!r} does not fit {len(items)} tensors")
