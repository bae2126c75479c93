"""Foundry: persist CUDA graphs with their execution context and restore them in a fresh process.

Import as ``import foundry_core as fdry``. The process must run with libfoundry.so preloaded
(``foundry run -- CMD``) for the region and the image registry to see the CUDA runtime's calls.
"""

from __future__ import annotations

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
from foundry_core.images import (
    Image,
    init_nvshmem_for_loaded_modules,
    load_cuda_modules_and_libraries,
    loaded_images,
    pack_images,
)
from foundry_core.preload import preload_environment, preload_path
from foundry_core.region import (
    Divergence,
    LogEntry,
    RegionInfo,
    allocation_divergence,
    allocation_log,
    allocation_region,
    compare_logs,
    expect_allocation_log,
    free_preallocated_region,
    get_current_alloc_offset,
    preallocate_region,
    region_info,
    release_allocation_region,
    resume_allocation_region,
    set_allocation_region,
    set_allocation_tag,
    set_current_alloc_offset,
    stop_allocation_region,
)
from foundry_core.sizes import format_size, parse_size
from foundry_core.graphs import (
    GraphArchive,
    PendingGraphLoads,
    RestoredGraph,
    SaveReport,
    graph,
    load_graphs,
    open_archive,
    save_graph_manifest,
    save_graphs,
)


def __getattr__(name: str):
    # CUDAGraph subclasses torch's, so torch is imported only when it is asked for.
    if name == "CUDAGraph":
        from foundry_core.cuda_graph import CUDAGraph

        return CUDAGraph
    raise AttributeError(f"module 'foundry_core' has no attribute {name!r}")

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
