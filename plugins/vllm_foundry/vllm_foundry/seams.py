"""Every place where vllm-foundry touches vLLM, in one declarative list.

The patching code (``patching.py``, ``worker_patches.py``, ``capture_patches.py``) looks seams up
here by name, and the contract tests check this same list against the installed vLLM and against
the newest release's source (``contract.py``). A seam (:class:`foundry_core.engine.seam.Seam`)
records what the plugin relies on:

- ``module`` / ``qualname``: the attribute the plugin wraps or reads (``Worker.init_device``);
- ``kind``: function, method, staticmethod, classmethod, property, enum, constant, env;
- ``params``: the leading parameter names the wrapper relies on (more may follow);
- ``defined_in``: where a function is defined when ``module`` imports it by name (the plugin
  replaces the importing module's attribute, so that module must call it by its bare name);
- ``calls``: dotted names the body must call (the plugin swaps ``torch.cuda.CUDAGraph`` during
  capture, so the capture loop must construct its graphs through that name);
- ``assigns``: ``self`` attributes the body must assign (state the plugin reads or restores);
- ``members`` / ``value``: enum members or a constant's value.

``TABLE`` bundles them with the engine's name and tested versions for the engine-agnostic
patching and contract code in ``foundry_core.engine``.

Checked against vLLM 0.25.0 (the release validated on the GPU machine) and 0.33.0.
"""

from __future__ import annotations

from foundry_core.engine.seam import KINDS, Seam, SeamTable

__all__ = ["KINDS", "Seam", "SEAMS", "TABLE", "TESTED_VERSIONS", "BY_NAME", "seam", "source_files"]

TESTED_VERSIONS = ("0.25.0",)


_WORKER = "vllm.v1.worker.gpu_worker"
_RUNNER_V2 = "vllm.v1.worker.gpu.model_runner"
_CG_V2 = "vllm.v1.worker.gpu.cudagraph_utils"
_PIECE = "vllm.compilation.cuda_graph"

SEAMS: tuple[Seam, ...] = (
    # ---- plugin loading and processes ------------------------------------------------------
    Seam("plugins.group", "vllm.plugins", "DEFAULT_PLUGINS_GROUP", "constant", value="vllm.general_plugins",
         purpose="the entry-point group vLLM loads in every process (process 0, EngineCore, workers)"),
    Seam("plugins.load", "vllm.plugins", "load_general_plugins", "function",
         purpose="calls register() once per process"),
    Seam("env.mp_method", "vllm.envs", "VLLM_WORKER_MULTIPROC_METHOD", "env",
         purpose="register() sets it to spawn so children exec with LD_PRELOAD"),
    Seam("env.mega_aot_artifact", "vllm.envs", "VLLM_USE_MEGA_AOT_ARTIFACT", "env",
         purpose="set to 1 in Foundry mode unless the user set it: LOAD loads the compiled model whole"),
    # The fork server (fork_server.py): only in the API server, only when it runs.
    Seam("process.engine_core_launch", "vllm.v1.engine.utils", "CoreEngineProcManager.__init__", "method",
         params=("self", "local_engine_count"), calls=("get_mp_context", "context.Process"),
         purpose="creates the engine-core processes through the module's get_mp_context(), which the plugin makes "
                 "give a view that forks them from the fork server for the call"),
    Seam("process.engine_core_mp_context", "vllm.v1.engine.utils", "get_mp_context", "function",
         defined_in="vllm.utils.system_utils",
         purpose="the multiprocessing context the engine-core launch starts its processes through"),
    Seam("process.engine_core_target", "vllm.v1.engine.core", "EngineCoreProc.run_engine_core", "staticmethod",
         purpose="the engine core's process target, which the fork server's imports make ready and the log names"),
    # ---- compile caches carried in the archive (compile_cache.py) ---------------------------
    Seam("env.cache_root", "vllm.envs", "VLLM_CACHE_ROOT", "env",
         purpose="the root of vLLM's compile cache and model-info cache, whose files SAVE carries and LOAD puts back"),
    Seam("env.xla_cache_path", "vllm.envs", "VLLM_XLA_CACHE_PATH", "env", required=False,
         purpose="a host path in vLLM's compile-cache key, hashed as at SAVE by a LOAD (compile_key.py); optional: "
                 "without it the key has no such path"),
    Seam("env.config_root", "vllm.envs", "VLLM_CONFIG_ROOT", "env", required=False,
         purpose="a host path in vLLM's compile-cache key, hashed as at SAVE by a LOAD (compile_key.py)"),
    Seam("compile.key_env_factors", "vllm.envs", "compile_factors", "function", required=False,
         purpose="the environment part of vLLM's compile-cache key, which hashes VLLM_XLA_CACHE_PATH and "
                 "VLLM_CONFIG_ROOT; a LOAD wraps it to hash SAVE's values (compile_key.py)"),
    Seam("compile.key_env_aot", "vllm.compilation.caching", "aot_compile_hash_factors", "function",
         params=("vllm_config",), calls=("envs.compile_factors",), required=False,
         purpose="the AOT artifact's key (torch_aot_compile/<hash>) hashes envs.compile_factors() through the "
                 "module, where the wrapper of compile.key_env_factors reaches it"),
    Seam("compile.key_env_dir", "vllm.compilation.backends", "VllmBackend.__call__", "method",
         params=("self", "graph"), calls=("envs.compile_factors",), required=False,
         purpose="the compile cache's directory key (torch_compile_cache/<hash>) hashes envs.compile_factors() "
                 "through the module, where the wrapper of compile.key_env_factors reaches it"),
    Seam("compile.aot_load", "vllm.compilation.decorators", "_try_load_aot_compiled_fn", "function",
         params=("model", "aot_compilation_path"),
         purpose="vLLM loads the AOT artifact from torch_compile_cache/torch_aot_compile/<hash>/rank_<r>_<dp>/model"),
    Seam("registry.model_info_dir", "vllm.model_executor.models.registry", "_LazyRegisteredModel._get_cache_dir",
         "staticmethod", purpose="vLLM's model-class inspection cache (VLLM_CACHE_ROOT/modelinfos), carried"),
    # ---- tensor parallel -------------------------------------------------------------------
    Seam("env.symm_mem_all_reduce", "vllm.envs", "VLLM_ALLREDUCE_USE_SYMM_MEM", "env",
         purpose="set to 0 for tensor parallel: symmetric-memory all-reduce bakes peers' mappings into graphs"),
    Seam("parallel.world_group", "vllm.distributed.parallel_state", "get_world_group", "function",
         purpose="LOAD: every rank (tensor and data parallel) agrees, on the world's CPU group, that every "
                 "rank restored, else all capture"),
    # ---- command line ----------------------------------------------------------------------
    Seam("cli.add_cli_args", "vllm.engine.arg_utils", "EngineArgs.add_cli_args", "staticmethod",
         params=("parser",), purpose="adds --foundry-archive and --foundry-mode"),
    Seam("cli.from_cli_args", "vllm.engine.arg_utils", "EngineArgs.from_cli_args", "classmethod",
         params=("cls", "args"), purpose="exports the flags as FOUNDRY_ARCHIVE / FOUNDRY_MODE"),
    # ---- configuration read by the adapter and the mode check -------------------------------
    Seam("config.cudagraph_mode", "vllm.config.compilation", "CUDAGraphMode", "enum",
         members=("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"),
         purpose="the supported-mode check (FULL_AND_PIECEWISE, FULL_DECODE_ONLY)"),
    # vLLM 0.34.0 removed the V1 runner and this property (config.uses_v2_runner: V2 where it is absent).
    Seam("config.use_v2", "vllm.config.vllm", "VllmConfig.use_v2_model_runner", "property",
         params=("self",), required=False, purpose="V2 model runner check"),
    Seam("config.model_hash", "vllm.config.model", "ModelConfig.compute_hash", "method",
         params=("self",), required=False,
         purpose="part of the model identity (vLLM's own graph-shaping factors); optional: read with getattr"),
    # ---- worker startup (shared by V1 and V2) ----------------------------------------------
    Seam("worker.init_distributed", _WORKER, "init_worker_distributed_environment", "function",
         params=("vllm_config", "rank"),
         purpose="session.begin() before NCCL (device already set), determinism boundary after"),
    Seam("worker.init_device", _WORKER, "Worker.init_device", "method", params=("self",),
         calls=("init_worker_distributed_environment",),
         purpose="refuses unsupported configurations before any GPU work; checks the session began"),
    Seam("worker.determine_available_memory", _WORKER, "Worker.determine_available_memory", "method",
         params=("self",),
         purpose="LOAD: the recorded KV-cache bytes instead of profiling; SAVE: profiles outside the region"),
    Seam("worker.initialize_from_config", _WORKER, "Worker.initialize_from_config", "method",
         params=("self", "kv_cache_config"), purpose="records / checks the KV-cache block count"),
    Seam("worker.compile_or_warm_up_model", _WORKER, "Worker.compile_or_warm_up_model", "method",
         params=("self",), purpose="marks the warmup phase (compile warmup, kernel warmup, capture)"),
    Seam("worker.kernel_warmup", _WORKER, "kernel_warmup", "function", params=("worker",),
         defined_in="vllm.model_executor.warmup.kernel_warmup",
         purpose="LOAD: skipped; SAVE: runs outside the region"),
    Seam("worker.warmup_kernels", _WORKER, "warmup_kernels", "function",
         params=("model_runner", "worker_execute_model", "worker_sample_tokens"),
         defined_in="vllm.v1.worker.gpu.warmup",
         purpose="V2 JIT warmup: outside the region whenever the region is active; FOUNDRY_VLLM_JIT_WARMUP=0 "
                 "skips it on LOAD"),
    # ---- V2 model runner -------------------------------------------------------------------
    Seam("runner.init", _RUNNER_V2, "GPUModelRunner.__init__", "method", params=("self", "vllm_config", "device"),
         assigns=("cudagraph_manager",), purpose="the runner's graph manager the capture seam recognises"),
    Seam("runner.dummy_run", _RUNNER_V2, "GPUModelRunner._dummy_run", "method", params=("self", "num_tokens"),
         purpose="compile-warmup forwards: LOAD skips them, SAVE runs them outside the region"),
    Seam("runner.capture_model", _RUNNER_V2, "GPUModelRunner.capture_model", "method", params=("self",),
         calls=("self.cudagraph_manager.capture",),
         purpose="the capture phase; the region stops when it returns"),
    Seam("cg.manager_init", _CG_V2, "CudaGraphManager.__init__", "method", params=("self", "vllm_config"),
         assigns=("graphs", "_graphs_captured", "cudagraph_mode", "_capture_descs"),
         purpose="graph table and capture descriptors the plugin fills / reads"),
    Seam("cg.capture", _CG_V2, "CudaGraphManager.capture", "method", params=("self", "create_forward_fn"),
         calls=("torch.cuda.CUDAGraph", "torch.cuda.graph", "create_forward_fn"),
         assigns=("graphs", "_graphs_captured"),
         purpose="SAVE: vLLM's own loop with graphs that keep their CUgraph, then save; LOAD: the same loop with "
                 "forwards and captures neutralised, restored graphs installed"),
    Seam("cg.model_manager_init", _CG_V2, "ModelCudaGraphManager.__init__", "method", params=("self", "vllm_config"),
         assigns=("hidden_states", "aux_hidden_states", "use_aux_hidden_state_outputs"),
         purpose="the persistent output buffers the FULL graphs write (restored as graph outputs at LOAD)"),
    Seam("cg.run_fullgraph", _CG_V2, "CudaGraphManager.run_fullgraph", "method", params=("self", "desc"),
         purpose="replays self.graphs[desc] (restored graphs have .replay())"),
    Seam("runner.dummy_request_id", "vllm.v1.worker.gpu.input_batch", "random_uuid", "function",
         defined_in="vllm.utils", required=False,
         purpose="LOAD: the dummy requests of the neutralised capture loop are numbered instead of given random "
                 "UUIDs (0.18 s of LOAD's graph step for the 8B shapes); optional: without it they keep UUIDs"),
    # ---- vLLM's shared workspace (workspace.py); a vLLM without one has nothing to re-allocate ---
    Seam("workspace.initialized", "vllm.v1.worker.workspace", "is_workspace_manager_initialized", "function",
         required=False, purpose="whether this process has a workspace manager"),
    Seam("workspace.current", "vllm.v1.worker.workspace", "current_workspace_manager", "function",
         required=False,
         purpose="the manager whose buffers are allocated again in the region after the memory profile"),
    Seam("workspace.init", "vllm.v1.worker.workspace", "WorkspaceManager.__init__", "method",
         params=("self", "device"), assigns=("_device", "_current_workspaces"), required=False,
         purpose="the per-slot buffers (_current_workspaces) and their device, read and replaced"),
    # ---- piecewise graphs (FULL_AND_PIECEWISE, PIECEWISE; missing ones refuse only those modes) ---
    Seam("piece.call", _PIECE, "CUDAGraphWrapper.__call__", "method", params=("self",),
         purpose="LOAD: installs a restored piece as the wrapper's entry at its first call for a descriptor"),
    Seam("piece.init", _PIECE, "CUDAGraphWrapper.__init__", "method",
         params=("self", "runnable", "vllm_config", "runtime_mode"),
         assigns=("runnable", "runtime_mode", "concrete_cudagraph_entries"),
         purpose="the attributes read to name a piece and to install its entries"),
    Seam("piece.instances", _PIECE, "CUDAGraphWrapper._all_instances", "constant",
         purpose="SAVE: every wrapper, to collect the captured pieces"),
    Seam("piece.entry", _PIECE, "CUDAGraphEntry", "constant",
         purpose="LOAD: the entry made for a restored piece (batch_descriptor, cudagraph, output, input_addresses)"),
    Seam("piece.backend", "vllm.compilation.piecewise_backend", "PiecewiseBackend.__init__", "method",
         params=("self", "graph", "vllm_config", "piecewise_compile_index", "total_piecewise_compiles"),
         assigns=("piecewise_compile_index", "total_piecewise_compiles", "vllm_backend"),
         purpose="a piece's stable name: its compiled module's prefix, index and count"),
    Seam("piece.context", "vllm.forward_context", "get_forward_context", "function",
         purpose="LOAD: the batch descriptor and runtime mode of the call a piece is installed for"),
    Seam("piece.context_available", "vllm.forward_context", "is_forward_context_available", "function",
         purpose="LOAD: no forward context, no piece to install"),
)

TABLE = SeamTable(
    engine="vLLM", package="vllm", tested_versions=TESTED_VERSIONS, seams=SEAMS,
    # Their seams are only checked or called, never wrapped, or (vllm.envs) vLLM calls the wrapped
    # function through the module from other modules: no bare-name call inside the module is needed.
    read_only_modules=("vllm.plugins", "vllm.forward_context", "vllm.v1.worker.workspace", "vllm.envs",
                       "vllm.compilation.caching"),
)

BY_NAME: dict[str, Seam] = TABLE.by_name


# The seam called ``name`` (KeyError naming the known ones otherwise), and every file a seam may
# live in (relative path, module or package form; only some exist) for the source contract check.
seam = TABLE.seam
source_files = TABLE.source_files
