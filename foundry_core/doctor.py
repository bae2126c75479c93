"""`foundry doctor`: what this machine offers Foundry, checked one item at a time."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from foundry_core import _native
from foundry_core.errors import FoundryError
from foundry_core.preload import preload_path

DEFAULT_REGION_BASE = 0x6000_0000_0000
PROBE_REGION_SIZE = 1 << 30


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def run_checks() -> list[Check]:
    checks = []
    try:
        path = preload_path()
        checks.append(Check("library", True, path))
    except FileNotFoundError as exc:
        return [Check("library", False, str(exc))]
    lib = _native.lib()
    checks.append(Check("version", True, lib.foundry_version().decode()))
    active = bool(lib.foundry_preload_active())
    checks.append(Check("preload", active, "active in this process" if active else
                        "not active in this process (run commands with `foundry run -- CMD`)"))
    version = ctypes.c_int()
    try:
        _native.call("foundry_driver_version", ctypes.byref(version))
    except FoundryError as exc:
        checks.append(Check("driver", False, f"no GPU: {exc}"))
        return checks
    checks.append(Check("driver", True, f"CUDA driver API {version.value // 1000}.{version.value % 1000 // 10}"))
    name = ctypes.create_string_buffer(256)
    major, minor, mem = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint64()
    try:
        _native.call("foundry_device_info", int(os.environ.get("FOUNDRY_DEVICE", "0")), name, len(name),
                     ctypes.byref(major), ctypes.byref(minor), ctypes.byref(mem))
        checks.append(Check("gpu", True, f"{name.value.decode()} (sm_{major.value}{minor.value}, "
                                         f"{mem.value / 2**30:.0f} GiB)"))
    except FoundryError as exc:
        checks.append(Check("gpu", False, f"no GPU: {exc}"))
        return checks
    checks.append(_probe_region())
    return checks


def _probe_region() -> Check:
    try:
        _native.call("foundry_region_set", DEFAULT_REGION_BASE, PROBE_REGION_SIZE)
        _native.call("foundry_region_release")
        return Check("region", True, f"the default base {DEFAULT_REGION_BASE:#x} can be reserved")
    except FoundryError as exc:
        return Check("region", False, f"the default base {DEFAULT_REGION_BASE:#x} cannot be reserved: {exc}")
