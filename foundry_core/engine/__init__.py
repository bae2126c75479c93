"""Engine-agnostic runtime shared by Foundry's engine plugins (vLLM, SGLang, TensorRT-LLM).

A plugin registers an engine adapter (hooks in :mod:`foundry_core.engine.hookspecs`), prepares
the environment of the engine's processes (:func:`prepare_child_environment`) and drives one
:class:`EngineSession` per rank at the engine's seams. The seams themselves are declared in a
:class:`SeamTable`, wrapped by a :class:`Patcher` and checked against engine releases with
:func:`check_sources` / :func:`check_installed` (:mod:`foundry_core.engine.contract`). See
docs/engine-runtime.md.

The pieces every plugin's seams share: :class:`WorkerRuntime` (one model-running process's
state: region pauses, fallback, end of the region; :mod:`foundry_core.engine.worker`), the
capture helpers (:mod:`foundry_core.engine.capture`), the ``--foundry-*`` flags
(:mod:`foundry_core.engine.flags`), :class:`EngineAdapter` and :func:`plain` for the hooks, the
plugin's own variables (:mod:`foundry_core.engine.options`) and :func:`setup_logging`.
"""

from __future__ import annotations

from foundry_core._lazy import lazy_exports

# Where each name is defined, imported on its first use: a process that needs one piece (the
# start-up hook, a plugin's first process, the fork server) imports that piece alone.
_HOMES: dict[str, tuple[str, ...]] = {
    "foundry_core.engine.adapter": ("EngineAdapter", "distribution_version"),
    "foundry_core.engine.capture": ("NoCapture", "PendingGraph", "address_mismatch", "graph_name", "inference_mode",
                                    "keep_graphs", "neutralised", "swapped", "tensor_addresses"),
    "foundry_core.engine.contract": ("PluginContract", "SeamResult", "check_installed", "check_sources",
                                     "directory_reader"),
    "foundry_core.engine.environment": ("REQUIRED_SETTINGS", "ensure_preloaded_or_reexec",
                                        "plugin_child_environment", "preload_active", "prepare_child_environment"),
    "foundry_core.engine.fingerprint": ("ParallelConfig", "canonical_json", "config_hash", "describe_mismatch",
                                        "engine_fields", "engine_fingerprint", "explain_mismatch"),
    "foundry_core.engine.flags": ("add_foundry_args", "export", "settings_from_args"),
    "foundry_core.engine.hookspecs": ("REQUIRED_HOOKS", "hookimpl", "hookspec"),
    "foundry_core.engine.layout": ("ENGINE_INFO_NAME", "Topology", "check_topology", "rank_dir", "read_topology",
                                   "write_topology"),
    "foundry_core.engine.logs": ("setup_logging",),
    "foundry_core.engine.mode": ("Mode", "Settings", "check_complete", "is_complete", "parse_mode", "resolve_mode",
                                 "resolve_settings"),
    "foundry_core.engine.options": ("env_flag", "instantiate_mode"),
    "foundry_core.engine.patching": ("Patcher", "SeamError"),
    "foundry_core.engine.plugin_manager": ("ENTRY_POINT_GROUP", "FoundryPluginManager", "get_plugin_manager"),
    "foundry_core.engine.seam": ("Seam", "SeamTable"),
    "foundry_core.engine.session": ("DEFAULT_REGION_SIZE", "DEFAULT_SCRATCH_SIZE", "EngineSession",
                                    "NativeRegionRuntime", "RegionRuntime", "fallback_enabled"),
    "foundry_core.engine.state": ("STATE_NAME", "EngineState", "read_state", "write_state"),
    "foundry_core.engine.triton_key": ("wait_triton_key", "warm_triton_key"),
    "foundry_core.engine.values": ("plain",),
    "foundry_core.engine.worker": ("DeviceOps", "WorkerRuntime", "timed"),
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())

__all__ = [
    # mode
    "Mode", "Settings", "parse_mode", "resolve_mode", "resolve_settings", "check_complete", "is_complete",
    # layout
    "ENGINE_INFO_NAME", "Topology", "rank_dir", "read_topology", "write_topology", "check_topology",
    # fingerprint
    "ParallelConfig", "engine_fingerprint", "engine_fields", "config_hash", "canonical_json", "explain_mismatch",
    "describe_mismatch",
    # state
    "STATE_NAME", "EngineState", "read_state", "write_state",
    # hooks
    "hookimpl", "hookspec", "REQUIRED_HOOKS", "FoundryPluginManager", "get_plugin_manager", "ENTRY_POINT_GROUP",
    # session
    "EngineSession", "RegionRuntime", "NativeRegionRuntime", "fallback_enabled", "DEFAULT_REGION_SIZE",
    "DEFAULT_SCRATCH_SIZE",
    # environment
    "prepare_child_environment", "preload_active", "ensure_preloaded_or_reexec", "REQUIRED_SETTINGS",
    "plugin_child_environment",
    # seams
    "Seam", "SeamTable", "Patcher", "SeamError", "SeamResult", "check_sources", "check_installed", "directory_reader",
    "PluginContract",
    # a plugin's worker runtime
    "WorkerRuntime", "DeviceOps", "timed", "wait_triton_key", "warm_triton_key",
    # capture helpers
    "graph_name", "tensor_addresses", "address_mismatch", "swapped", "PendingGraph", "NoCapture", "keep_graphs",
    "neutralised", "inference_mode",
    # command-line flags
    "add_foundry_args", "settings_from_args", "export",
    # adapters
    "EngineAdapter", "distribution_version", "plain",
    # plugin options and logging
    "env_flag", "instantiate_mode", "setup_logging",
]
