"""The kernel-image registry: what the process loaded, and reloading archived images."""

from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import dataclass

from foundry_core import _native
from foundry_core.errors import FormatError

logger = logging.getLogger("foundry")

IMAGE_KINDS = ("unknown", "fatbin-wrapper", "fatbin", "cubin", "ptx")
_NAME_MAX = 1 << 16


@dataclass(frozen=True)
class Image:
    hash: int
    size: int
    kind: str
    loader: str
    segments: int
    entry_count: int
    nvshmem: bool
    from_archive: bool

    @property
    def hash_hex(self) -> str:
        return f"{self.hash:016x}"


def loaded_images() -> list[Image]:
    """Every image this process loaded (seen through the preload) or restored from an archive."""
    count = ctypes.c_uint64()
    _native.call("foundry_images_count", ctypes.byref(count))
    out = []
    for i in range(count.value):
        r = _native.ImageRecord()
        _native.call("foundry_images_get", i, ctypes.byref(r))
        out.append(Image(r.hash, r.size, IMAGE_KINDS[r.kind] if r.kind < len(IMAGE_KINDS) else "unknown",
                         "library" if r.loader else "module", r.segments, r.entry_count, bool(r.nvshmem),
                         bool(r.from_archive)))
    return out


def image_entries(image_hash: int, count: int) -> list[str]:
    """Kernel names of a loaded image."""
    names = []
    buf = ctypes.create_string_buffer(_NAME_MAX)
    for i in range(count):
        _native.call("foundry_image_entry_name", image_hash, i, buf, len(buf))
        names.append(buf.value.decode())
    return names


def function_image(handle: int) -> tuple[int, str]:
    """(image hash, kernel name) of a CUfunction handle."""
    h = ctypes.c_uint64()
    buf = ctypes.create_string_buffer(_NAME_MAX)
    _native.call("foundry_function_lookup", handle, ctypes.byref(h), buf, len(buf))
    return h.value, buf.value.decode()


def resolve_function(image_hash: int, name: str) -> int:
    """The CUfunction for (image hash, kernel name) in this process."""
    out = ctypes.c_uint64()
    _native.call("foundry_function_resolve", image_hash, name.encode(), ctypes.byref(out))
    return out.value


def function_cache_config(handle: int) -> int:
    """The cache preference (CUfunc_cache) last set on a CUfunction in this process, as Foundry saw
    it: the process's own cuFuncSetCacheConfig calls (under the preload) and those LOAD made for
    restored graphs. 0 (prefer_none) when none was set; the driver cannot be asked."""
    out = ctypes.c_int32()
    _native.call("foundry_function_cache_config", handle, ctypes.byref(out))
    return out.value


def pack_images(directory: str | os.PathLike, hashes: list[int], arch: int = 0) -> None:
    """Writes the given images into ``directory/images/`` (one checksummed file per image).

    With ``arch`` (e.g. 90), fatbins are reduced to that architecture's cubin when they hold one.
    """
    arr = (ctypes.c_uint64 * max(len(hashes), 1))(*hashes)
    _native.call("foundry_images_pack", os.fsencode(directory), arr, len(hashes), arch)


# Graphs saved one by one (CUDAGraph.save("DIR/NAME.json")) keep their kernel images in
# DIR/hook_archive/images/: where scripts written for the original Foundry load them from
# (load_cuda_modules_and_libraries("hook_archive")), inside the directory the manifests describe.
SINGLE_GRAPH_IMAGES = "hook_archive"


def images_root(directory: str | os.PathLike) -> str:
    """The directory whose ``images/`` holds the kernel images of ``directory``: the directory
    itself (an archive, or ``hook_archive``), else its ``hook_archive/`` (graphs saved one by one)."""
    d = os.fspath(directory)
    single = os.path.join(d, SINGLE_GRAPH_IMAGES)
    if not os.path.lexists(os.path.join(d, "images")) and os.path.isdir(os.path.join(single, "images")):
        return single
    return d


def load_cuda_modules_and_libraries(directory: str | os.PathLike, lazy: bool = False) -> int:
    """Loads every image packed in ``directory/images/`` into this process; returns how many.

    ``directory`` is an archive directory, a directory of graphs saved one by one (their images
    are in its ``hook_archive/``), or that ``hook_archive`` itself. Call it before the application
    loads its own kernels: a later load of an identical image by the application (or the CUDA
    runtime) then returns the archived handle, so graphs and application share one copy of each
    module. Loading the same directory twice is harmless. With ``lazy``, every image is read and
    checked now but handed to the driver only when a restored graph first needs one of its
    kernels (or the application loads it).
    """
    directory = images_root(directory)
    images_dir = os.path.join(directory, "images")
    if os.path.islink(images_dir):
        raise FormatError(f"{images_dir} is a symbolic link; an archive's images must be plain files inside it")
    start = time.perf_counter()
    loaded = ctypes.c_uint64()
    _native.call("foundry_images_load_lazy" if lazy else "foundry_images_load", os.fsencode(directory), ctypes.byref(loaded))
    logger.info("%s %d kernel images in %.3f s", "read" if lazy else "loaded", loaded.value, time.perf_counter() - start)
    return loaded.value


def init_nvshmem_for_loaded_modules() -> int:
    """Runs NVSHMEM's module initialisation for archived images that use NVSHMEM.

    Call after NVSHMEM itself is initialised (e.g. after a DeepEP Buffer exists). Returns the
    number of images initialised; raises NotFoundError when one needs NVSHMEM and it is absent.
    """
    out = ctypes.c_uint64()
    _native.call("foundry_images_init_nvshmem", ctypes.byref(out))
    return out.value
