"""Output tensors: described at SAVE as (pointer, shape, stride, dtype), rebuilt at LOAD as torch
tensors over the same device memory, kept alive by the restored graph they belong to."""

from __future__ import annotations

from typing import Any

from foundry_core.errors import FormatError, UnsupportedError


def _torch():
    import torch

    return torch


def describe_outputs(outputs: Any) -> dict:
    """A JSON description of a graph's outputs: None, a tensor, or a list/tuple of tensors."""
    torch = _torch()
    if outputs is None:
        return {"kind": "none", "tensors": []}
    if isinstance(outputs, torch.Tensor):
        return {"kind": "tensor", "tensors": [_describe(outputs)]}
    if isinstance(outputs, (list, tuple)):
        return {"kind": "tuple" if isinstance(outputs, tuple) else "list", "tensors": [_describe(t) for t in outputs]}
    raise UnsupportedError(f"graph outputs must be a tensor or a list/tuple of tensors, not {type(outputs).__name__}")


def _describe(t: Any) -> dict:
    torch = _torch()
    if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
        raise UnsupportedError("every graph output must be a CUDA tensor")
    return {"ptr": t.data_ptr(), "shape": list(t.shape), "stride": list(t.stride()),
            "dtype": str(t.dtype).removeprefix("torch.")}


class _DeviceBytes:
    """Exposes a device byte range through __cuda_array_interface__; holds the owner alive."""

    def __init__(self, ptr: int, nbytes: int, owner: Any):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


def rebuild_outputs(description: dict, owner: Any) -> Any:
    """Torch tensors at the described addresses; each keeps ``owner`` (the restored graph) alive."""
    tensors = [_rebuild(t, owner) for t in description["tensors"]]
    kind = description["kind"]
    if kind == "none":
        return None
    if kind == "tensor":
        return tensors[0]
    return tuple(tensors) if kind == "tuple" else tensors


def _rebuild(t: dict, owner: Any):
    torch = _torch()
    dtype = getattr(torch, t["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise FormatError(f"unknown dtype {t['dtype']!r} in the archive")
    itemsize = torch.empty((), dtype=dtype).element_size()
    shape, stride = t["shape"], t["stride"]
    if any(s == 0 for s in shape):
        return torch.empty(shape, dtype=dtype, device="cuda")
    span = (sum((n - 1) * s for n, s in zip(shape, stride)) + 1) * itemsize
    raw = torch.as_tensor(_DeviceBytes(t["ptr"], span, owner), device="cuda")
    return raw.view(dtype).as_strided(shape, stride)
