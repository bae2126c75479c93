"""Locating libfoundry.so and binding to the one copy of it in this process.

The library is both the LD_PRELOAD interposer and the engine the Python API drives. When the
preload is active, the process already holds a copy with all the state (region, image registry);
binding to a second copy would split that state, so the global namespace is searched first.
"""

from __future__ import annotations

import ctypes
import functools
import os
from importlib import metadata
from pathlib import Path

LIBRARY_NAME = "libfoundry.so"
_PROBE_SYMBOL = "foundry_version"


def _candidates() -> list[Path]:
    here = Path(__file__).resolve().parent
    found = []
    env = os.environ.get("FOUNDRY_LIBRARY")
    if env:
        found.append(Path(env))
    found.append(here / LIBRARY_NAME)
    try:
        dist = metadata.distribution("foundry-core")
        for f in dist.files or []:
            if f.name == LIBRARY_NAME:
                found.append(Path(dist.locate_file(f)).resolve())
    except metadata.PackageNotFoundError:
        pass
    # A plain CMake build in the source tree (cmake -B build).
    found.append(here.parent / "build" / LIBRARY_NAME)
    return found


@functools.lru_cache(maxsize=1)
def library_path() -> Path:
    """Path of the libfoundry.so that `foundry run` preloads and the Python API binds to."""
    for path in _candidates():
        if path.is_file():
            return path
    searched = ", ".join(str(p) for p in _candidates())
    raise FileNotFoundError(
        f"{LIBRARY_NAME} not found (searched {searched}); install the package with "
        "`pip install -e .` or set FOUNDRY_LIBRARY to the built library"
    )


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL:
    """The process's libfoundry.so: the preloaded copy when there is one, else the packaged one."""
    preloaded = ctypes.CDLL(None)
    if hasattr(preloaded, _PROBE_SYMBOL):
        # Resolve through the preloaded object's own path so lookups stay within it.
        info = _dladdr_path(ctypes.cast(getattr(preloaded, _PROBE_SYMBOL), ctypes.c_void_p).value)
        return ctypes.CDLL(info or str(library_path()), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(str(library_path()), mode=ctypes.RTLD_GLOBAL)


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _dladdr_path(address: int | None) -> str | None:
    if not address:
        return None
    libc = ctypes.CDLL(None)
    info = _DlInfo()
    if libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) == 0 or not info.dli_fname:
        return None
    return info.dli_fname.decode()
