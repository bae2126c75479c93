"""The environment fingerprint: what must match between SAVE and LOAD for graphs to be valid."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

from foundry_core import __version__, _native
from foundry_core.errors import MismatchError

# Fields compared at LOAD. Values are plain JSON scalars.
COMPARED_FIELDS = ("gpu_name", "compute_capability", "driver_version", "cuda_runtime", "torch_version",
                   "foundry_version")


def current_fingerprint(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fingerprint of this process's environment (the device is the current CUDA device)."""
    fp: dict[str, Any] = {"foundry_version": __version__}
    version = ctypes.c_int()
    _native.call("foundry_driver_version", ctypes.byref(version))
    fp["driver_version"] = version.value
    torch = sys.modules.get("torch")
    device = int(os.environ.get("FOUNDRY_DEVICE", "0"))
    if torch is not None and torch.cuda.is_available():
        device = torch.cuda.current_device()
        fp["torch_version"] = torch.__version__
        fp["cuda_runtime"] = torch.version.cuda
    name = ctypes.create_string_buffer(256)
    major, minor, mem = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint64()
    _native.call("foundry_device_info", device, name, len(name), ctypes.byref(major), ctypes.byref(minor),
                 ctypes.byref(mem))
    fp["gpu_name"] = name.value.decode()
    fp["compute_capability"] = f"{major.value}.{minor.value}"
    fp.update(extra or {})
    return fp


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], fields: tuple[str, ...] | None = None) -> None:
    """Raises MismatchError naming the first field whose saved and current values differ.

    Every environment field is required: an archive whose fingerprint lacks one (edited, or
    written by something else) matches no machine."""
    if fields is None:
        for field in COMPARED_FIELDS:
            if field not in saved:
                raise MismatchError(f"archive fingerprint lacks {field!r}: it cannot be checked against this machine")
    for field in fields or tuple(dict.fromkeys((*COMPARED_FIELDS, *saved))):
        if saved.get(field) != current.get(field):
            raise MismatchError(f"archive fingerprint mismatch on {field!r}: saved {saved.get(field)!r}, "
                                f"this machine {current.get(field)!r}")
