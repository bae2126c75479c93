"""Foundry: persist CUDA graphs with their execution context and restore them in a fresh process.

Import as ``import foundry_core as fdry``. The process must run with libfoundry.so preloaded
(``foundry run -- CMD``) for the region and the image registry to see the CUDA runtime's calls.
"""

from __future__ import annotations

from foundry_core._lazy import lazy_exports

__version__ = "0.1.0"

from foundry_core.errors import (
    AuditError,
    BusyError,
    CudaError,
    DivergenceError,
    FixedAddressError,
    FormatError,
    FoundryError,
    MismatchError,
    NoDriverError,
    NotFoundError,
    RegionExhaustedError,
    StateError,
    UnsupportedError,
    VersionError,
)

# Where each public name is defined, imported on its first use: the plugins' early starts import
# foundry_core.engine.fork_server at interpreter start-up without the native library (and its
# import time), and CUDAGraph subclasses torch's, so torch is imported only when it is asked for.
_HOMES: dict[str, tuple[str, ...]] = {
    "foundry_core.graphs": ("GraphArchive", "PendingGraphLoads", "RestoredGraph", "SaveReport", "graph",
                            "load_graphs", "open_archive", "save_graph_manifest", "save_graphs"),
    "foundry_core.images": ("Image", "init_nvshmem_for_loaded_modules", "load_cuda_modules_and_libraries",
                            "loaded_images", "pack_images"),
    "foundry_core.preload": ("preload_environment", "preload_path"),
    "foundry_core.region": ("Divergence", "LogEntry", "RegionInfo", "allocation_divergence", "allocation_log",
                            "allocation_region", "compare_logs", "expect_allocation_log", "free_preallocated_region",
                            "get_current_alloc_offset", "preallocate_region", "region_info",
                            "release_allocation_region", "resume_allocation_region", "set_allocation_region",
                            "set_allocation_tag", "set_current_alloc_offset", "stop_allocation_region"),
    "foundry_core.sizes": ("format_size", "parse_size"),
    "foundry_core.cuda_graph": ("CUDAGraph",),
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())

__all__ = [
    "CUDAGraph", "GraphArchive", "PendingGraphLoads", "RestoredGraph", "SaveReport", "graph", "load_graphs",
    "open_archive", "save_graph_manifest", "save_graphs",
    "AuditError", "BusyError", "CudaError", "Divergence", "DivergenceError", "FixedAddressError", "FormatError",
    "FoundryError", "Image", "LogEntry", "MismatchError", "NoDriverError", "NotFoundError", "RegionExhaustedError",
    "RegionInfo", "StateError", "UnsupportedError", "VersionError", "allocation_divergence", "allocation_log",
    "allocation_region", "compare_logs", "expect_allocation_log", "format_size", "free_preallocated_region",
    "get_current_alloc_offset", "init_nvshmem_for_loaded_modules", "load_cuda_modules_and_libraries",
    "loaded_images", "pack_images", "parse_size", "preallocate_region", "preload_environment", "preload_path",
    "region_info", "release_allocation_region", "resume_allocation_region", "set_allocation_region",
    "set_allocation_tag", "set_current_alloc_offset", "stop_allocation_region",
]
