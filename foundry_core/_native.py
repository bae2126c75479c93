"""ctypes declarations of the C API (csrc/capi/foundry.h) and the status -> exception bridge."""

from __future__ import annotations

import ctypes
import functools
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p

from foundry_core import _library
from foundry_core.errors import error_for_status


class LogEntry(ctypes.Structure):
    _fields_ = [("seq", c_uint64), ("offset", c_uint64), ("size", c_uint64), ("kind", c_uint32), ("tag", c_uint32)]


class ImageRecord(ctypes.Structure):
    _fields_ = [
        ("hash", c_uint64), ("size", c_uint64), ("kind", c_uint32), ("loader", c_uint32),
        ("segments", c_uint32), ("entry_count", c_uint32), ("nvshmem", c_uint32), ("from_archive", c_uint32),
    ]


class SaveStats(ctypes.Structure):
    _fields_ = [("graphs", c_uint32), ("templates", c_uint32), ("nodes", c_uint64), ("images", c_uint32)]


class LoadTimes(ctypes.Structure):
    _fields_ = [
        ("read_s", ctypes.c_double), ("claim_s", ctypes.c_double), ("build_s", ctypes.c_double),
        ("instantiate_s", ctypes.c_double), ("mapped_blocks", c_uint64), ("existing_blocks", c_uint64),
        ("update_s", ctypes.c_double), ("nccl_events", c_uint64),
    ]


class ExecWarmup(ctypes.Structure):
    _fields_ = [("graphs", c_uint64), ("execs", c_uint64), ("nodes", c_uint64), ("seconds", ctypes.c_double)]


_u64p = POINTER(c_uint64)
_PROTOTYPES: dict[str, tuple] = {
    "foundry_last_error": (c_char_p, []),
    "foundry_version": (c_char_p, []),
    "foundry_preload_active": (c_int, []),
    "foundry_intercept_counter": (c_int64, [c_int]),
    "foundry_driver_version": (c_int, [POINTER(c_int)]),
    "foundry_device_info": (c_int, [c_int, c_char_p, c_size_t, POINTER(c_int), POINTER(c_int), _u64p]),
    "foundry_set_log_level": (None, [c_int]),
    "foundry_set_strict": (None, [c_int]),
    "foundry_get_strict": (c_int, []),
    "foundry_region_set": (c_int, [c_uint64, c_uint64]),
    "foundry_region_release": (c_int, []),
    "foundry_region_stop": (c_int, []),
    "foundry_region_resume": (c_int, []),
    "foundry_region_info": (c_int, [_u64p, _u64p, POINTER(c_int), _u64p, _u64p, _u64p, _u64p]),
    "foundry_region_get_offset": (c_int, [_u64p]),
    "foundry_region_set_offset": (c_int, [c_uint64]),
    "foundry_region_preallocate": (c_int, [c_uint64]),
    "foundry_region_free_preallocated": (c_int, []),
    "foundry_region_alloc": (c_int, [c_uint64, _u64p]),
    "foundry_region_free": (c_int, [c_uint64]),
    "foundry_region_claim": (c_int, [c_uint64, c_uint64, POINTER(c_int)]),
    "foundry_region_classify": (c_int, [c_uint64, POINTER(c_int), _u64p, _u64p]),
    "foundry_region_driver_calls": (c_int, [_u64p]),
    "foundry_region_set_tag": (c_int, [c_char_p, POINTER(c_uint32)]),
    "foundry_region_log_size": (c_int, [_u64p]),
    "foundry_region_log_read": (c_int, [c_uint64, POINTER(LogEntry), c_uint64, _u64p]),
    "foundry_region_log_tag": (c_int, [c_uint32, c_char_p, c_size_t]),
    "foundry_region_expect": (c_int, [POINTER(LogEntry), c_uint64]),
    "foundry_region_divergence": (c_int, [POINTER(c_int), POINTER(LogEntry), POINTER(LogEntry)]),
    "foundry_images_count": (c_int, [_u64p]),
    "foundry_images_get": (c_int, [c_uint64, POINTER(ImageRecord)]),
    "foundry_image_entry_name": (c_int, [c_uint64, c_uint32, c_char_p, c_size_t]),
    "foundry_function_lookup": (c_int, [c_uint64, _u64p, c_char_p, c_size_t]),
    "foundry_images_pack": (c_int, [c_char_p, _u64p, c_uint64, c_int]),
    "foundry_images_load": (c_int, [c_char_p, _u64p]),
    "foundry_images_load_lazy": (c_int, [c_char_p, _u64p]),
    "foundry_function_resolve": (c_int, [c_uint64, c_char_p, _u64p]),
    "foundry_function_cache_config": (c_int, [c_uint64, POINTER(c_int32)]),
    "foundry_images_init_nvshmem": (c_int, [_u64p]),
    "foundry_image_inspect": (c_int, [c_void_p, c_uint64, POINTER(c_uint32), _u64p, POINTER(c_uint32)]),
    "foundry_fatbin_extract_cubin": (c_int, [c_void_p, c_uint64, c_int, c_void_p, c_uint64, _u64p]),
    "foundry_hash64": (c_uint64, [c_void_p, c_uint64, c_uint64]),
    "foundry_graph_kernel_functions": (c_int, [c_uint64, _u64p, c_uint64, _u64p]),
    "foundry_graph_edges": (c_int, [c_uint64, POINTER(c_uint32), c_uint64, _u64p]),
    "foundry_graphset_template": (c_int, [c_void_p, c_uint64, _u64p]),
    "foundry_graphset_exec_flags": (c_int, [c_void_p, c_uint64, _u64p]),
    "foundry_saver_new": (c_int, [POINTER(c_void_p)]),
    "foundry_saver_add": (c_int, [c_void_p, c_uint64, c_char_p]),
    "foundry_saver_write": (c_int, [c_void_p, c_char_p, c_char_p, c_int, POINTER(SaveStats)]),
    "foundry_saver_free": (None, [c_void_p]),
    "foundry_payload_merge": (c_int, [POINTER(c_char_p), c_uint64, c_char_p, POINTER(c_uint32)]),
    "foundry_graphset_open": (c_int, [c_char_p, POINTER(c_void_p)]),
    "foundry_exec_memory_warm": (c_int, [c_char_p, POINTER(c_int), POINTER(ExecWarmup)]),
    "foundry_graphset_open_lazy": (c_int, [c_char_p, POINTER(c_void_p)]),
    "foundry_graphset_info": (c_int, [c_void_p, _u64p, _u64p, POINTER(LoadTimes)]),
    "foundry_graphset_name": (c_int, [c_void_p, c_uint64, c_char_p, c_size_t]),
    "foundry_graphset_instantiate": (c_int, [c_void_p, c_uint64]),
    "foundry_graphset_instantiate_all": (c_int, [c_void_p, c_int]),
    "foundry_graphset_start_background": (c_int, [c_void_p]),
    "foundry_graphset_ready": (c_int, [c_void_p, c_uint64, POINTER(c_int)]),
    "foundry_graphset_launch": (c_int, [c_void_p, c_uint64, c_uint64]),
    "foundry_graphset_free": (None, [c_void_p]),
    # inspection: char** results are malloc'd strings, read with ctypes.string_at, then foundry_free
    "foundry_payload_dump": (c_int, [c_char_p, POINTER(c_void_p)]),
    "foundry_payload_from_json": (c_int, [c_char_p, c_char_p]),
    "foundry_image_file_dump": (c_int, [c_char_p, POINTER(c_void_p)]),
    "foundry_container_check": (c_int, [c_char_p, POINTER(c_uint32)]),
    "foundry_image_file_write_synthetic": (c_int, [c_char_p, c_uint64, c_uint32, POINTER(c_char_p), c_uint32,
                                                   c_void_p, c_uint64]),
    "foundry_free": (None, [c_void_p]),
}


@functools.lru_cache(maxsize=1)
def lib() -> ctypes.CDLL:
    """The bound library with every C API function's prototype declared."""
    handle = _library.load()
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(handle, name)
        except AttributeError:
            raise ImportError(
                f"{handle._name} lacks {name}: the native library is older than this Python package; "
                "rebuild it (pip install -e .)") from None
        fn.restype = restype
        fn.argtypes = argtypes
    return handle


def check(status: int) -> None:
    """Raises the FoundryError subclass for a failed status, with the native message."""
    if status != 0:
        message = lib().foundry_last_error()
        raise error_for_status(status, message.decode(errors="replace") if message else "")


def call(name: str, *args) -> None:
    """Calls a status-returning C API function and raises on failure."""
    check(getattr(lib(), name)(*args))
