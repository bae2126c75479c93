"""Every place where sglang-foundry touches SGLang, in one declarative list.

The patching code (``patching.py``, ``worker_patches.py``, ``capture_patches.py``, ``cli.py``)
looks seams up here by name, and the contract checks (``contract.py``,
tests/engines/test_sglang_contract.py) check this same list against the installed SGLang and
against release wheels' source. The fields of a :class:`foundry_core.engine.seam.Seam` are
documented there; ``required=False`` marks a seam the plugin only reads for a check or a log line
and can do without.

Checked against SGLang 0.5.17 (pins torch 2.11; the release validated on the GPU machine).
docs/engine-sglang.md has the file:line of each seam in 0.5.17 and 0.5.23 and why it is here.

Why these attributes (0.5.17 scheduler start-up, in order):

- ``bootstrap._init_parallel_groups``: NCCL (``init_distributed_environment``,
  ``initialize_model_parallel``). The device is already set when it runs (in 0.5.17 by
  ``ModelRunner.__init__``, in 0.5.23 by ``init_parallel_runtime``), it is called by bare name
  inside ``bootstrap.py`` in both releases, and never for a draft worker: the region begins at its
  entry and is sealed when it returns.
- ``KVCacheConfigurator._resolve_memory_pool_config``: KV sizing by profiling free memory;
  ``ModelRunner.alloc_memory_pool`` then allocates the pools from its ``MemoryPoolConfig``.
- ``BaseRunner.warmup``: the once-per-process kernel warmup (FlashInfer workspaces and autotune,
  DeepGEMM), first reached from ``EagerRunner.__init__``.
- ``ModelRunner.init_cuda_graphs``: the capture phase; the region ends when it returns.
- ``DecodeCudaGraphRunner.capture`` / ``FullCudaGraphBackend.capture_one``: the decode capture
  loop and the per-shape warmup forwards and capture; ``_graphs`` / ``_outputs`` are the tables
  ``FullCudaGraphBackend.replay`` reads.
"""

from __future__ import annotations

from foundry_core.engine.seam import KINDS, Seam, SeamTable

__all__ = ["KINDS", "Seam", "SEAMS", "TABLE", "TESTED_VERSIONS", "BY_NAME", "seam", "source_files"]

TESTED_VERSIONS = ("0.5.17",)

_BOOTSTRAP = "sglang.srt.distributed.bootstrap"
_RUNNER = "sglang.srt.model_executor.model_runner"
_KVC = "sglang.srt.mem_cache.kv_cache_configurator"
_DCGR = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
_FCGB = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend"
_SCHEDULER = "sglang.srt.managers.scheduler"
_BCG = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
_PCGR = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
_BCGB = "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend"
_TCD = "sglang.srt.compilation.torch_compile_decoration"
_PARALLEL_STATE = "sglang.srt.distributed.parallel_state"
_SYMM_AG = "sglang.srt.distributed.device_communicators.triton_symm_mem_ag"

SEAMS: tuple[Seam, ...] = (
    # ---- plugin loading and processes ------------------------------------------------------
    Seam("plugins.group", "sglang.srt.plugins", "GENERAL_PLUGINS_GROUP", "constant", value="sglang.srt.plugins",
         purpose="the entry-point group SGLang loads in the main process and in every scheduler process"),
    Seam("plugins.load", "sglang.srt.plugins", "load_plugins", "function",
         purpose="calls register() once per process (a plugin that raises is only logged)"),
    Seam("process.scheduler", _SCHEDULER, "run_scheduler_process", "function",
         params=("server_args", "port_args", "gpu_id"), calls=("load_plugins",),
         purpose="the spawn target of scheduler processes: register() recognises them by it and installs the "
                 "worker and capture seams there"),
    Seam("process.start_method", "sglang.srt.entrypoints.engine", "_set_envs_and_config", "function",
         params=("server_args",), calls=("mp.set_start_method",),
         purpose="SGLang spawns its children, so the LD_PRELOAD the main process sets reaches every scheduler"),
    # The fork server (fork_server.py): only in the main process, only when it runs.
    Seam("process.launch_schedulers", "sglang.srt.entrypoints.engine", "Engine._launch_scheduler_processes",
         "classmethod", params=("cls", "server_args", "port_args"), calls=("mp.Process",),
         purpose="starts the scheduler processes through engine.py's `mp`, which the plugin makes fork them "
                 "from the fork server for the call"),
    Seam("process.launch_detokenizers", "sglang.srt.entrypoints.engine", "Engine._launch_detokenizer_subprocesses",
         "classmethod", params=("cls", "server_args", "port_args"), calls=("mp.Process",),
         purpose="starts the detokenizer through engine.py's `mp`, like the schedulers"),
    Seam("process.engine_mp", "sglang.srt.entrypoints.engine", "mp", "constant",
         purpose="the multiprocessing module engine.py starts its children through, replaced by a view that "
                 "forks them during the two launches"),
    # ---- command line ----------------------------------------------------------------------
    # Not required: without them register() warns that the flags are unavailable, and
    # FOUNDRY_ARCHIVE / FOUNDRY_MODE still work (as with sglang.Engine).
    Seam("cli.add_cli_args", "sglang.srt.server_args", "ServerArgs.add_cli_args", "staticmethod",
         params=("parser",), required=False, purpose="adds --foundry-archive and --foundry-mode"),
    Seam("cli.from_cli_args", "sglang.srt.server_args", "ServerArgs.from_cli_args", "classmethod",
         params=("cls", "args"), required=False,
         purpose="exports the flags as FOUNDRY_ARCHIVE / FOUNDRY_MODE and refuses unsupported settings early"),
    # ---- configuration read by the adapter and the mode check -------------------------------
    Seam("config.graph_backend", "sglang.srt.model_executor.cuda_graph_config", "Backend", "enum",
         members=("FULL", "BREAKABLE", "TC_PIECEWISE", "DISABLED"),
         purpose="the supported-mode check (decode backend full, prefill backend breakable or disabled)"),
    # SGLang declares its variables as attributes of ``Envs`` (read through ``envs.X.get()``), so
    # the seam is the declaration; modes.py reads the variable from the environment.
    Seam("env.post_capture_kv", "sglang.srt.environ", "Envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "constant",
         purpose="refused when true: it resizes the KV pool after capture"),
    # ---- NCCL and the region ---------------------------------------------------------------
    Seam("worker.parallel_groups", _BOOTSTRAP, "_init_parallel_groups", "function",
         params=("backend", "dist_init_method", "server_args"),
         calls=("init_distributed_environment", "initialize_model_parallel"),
         purpose="refuses unsupported settings, then session.begin() before NCCL (device already set) and the "
                 "determinism boundary after"),
    Seam("worker.torch_distributed", _RUNNER, "ModelRunner.init_torch_distributed", "method", params=("self",),
         calls=("bootstrap.init_torch_distributed",), required=False,
         purpose="0.5.17: where the scheduler reaches NCCL, after ModelRunner.__init__ set the device"),
    # Tensor parallel (FOUNDRY_SGLANG_TENSOR_PARALLEL=1): NCCL's all-reduce only, and the ranks'
    # agreements (ranks.py). Not required: one GPU needs none of them, and a tensor-parallel start
    # without them fails naming the seam.
    Seam("parallel.custom_all_reduce", _PARALLEL_STATE, "set_custom_all_reduce", "function", params=("enable",),
         required=False,
         purpose="turned off at the NCCL seam before the groups are made: the custom all-reduce bakes peers' "
                 "symmetric-memory addresses into the graphs"),
    Seam("parallel.world_group", _PARALLEL_STATE, "get_world_group", "function", required=False,
         purpose="its gloo communicator (cpu_group) carries the ranks' LOAD agreements"),
    Seam("comm.multimem_gather", _SYMM_AG, "MultimemAllGatherer._build", "method", params=("self", "x"), required=False,
         purpose="made to answer None (NCCL's all-gather) with tensor parallel: its multimem kernel writes to a "
                 "multicast address, and its buffer is made at the first eager call, which LOAD never makes"),
    # ---- KV cache --------------------------------------------------------------------------
    Seam("kv.resolve", _KVC, "KVCacheConfigurator._resolve_memory_pool_config", "method",
         params=("self", "pre_model_load_memory"), calls=("self._profile_available_bytes",),
         purpose="LOAD: the recorded MemoryPoolConfig instead of profiling; SAVE: profiles outside the region "
                 "and records it"),
    Seam("kv.configure", _KVC, "KVCacheConfigurator.configure", "method", params=("self", "pre_model_load_memory"),
         calls=("self._resolve_memory_pool_config",),
         purpose="the KV configurator sizes the pools from what _resolve_memory_pool_config returns"),
    Seam("kv.config", "sglang.srt.model_executor.pool_configurator", "MemoryPoolConfig.max_running_requests",
         "constant",
         purpose="LOAD rebuilds MemoryPoolConfig (a dataclass) with keywords from the recorded fields"),
    Seam("runner.alloc_memory_pool", _RUNNER, "ModelRunner.alloc_memory_pool", "method",
         params=("self", "memory_pool_config"), calls=("self.kv_cache_configurator.configure",),
         assigns=("max_total_num_tokens", "max_running_requests", "token_to_kv_pool", "memory_pool_config"),
         purpose="records the KV pool size (tokens, bytes) at SAVE, checks it at LOAD"),
    Seam("runner.post_capture_resize", _RUNNER, "ModelRunner.post_capture_resize_kv_pool", "method",
         params=("self",), purpose="refused when reached: the KV pool must not change after capture"),
    # ---- warmup ----------------------------------------------------------------------------
    Seam("warmup.runner", "sglang.srt.model_executor.runner.base_runner", "BaseRunner.warmup", "method",
         params=("self",), purpose="LOAD: skipped; SAVE: runs outside the region"),
    Seam("warmup.eager", "sglang.srt.model_executor.runner.eager_runner", "EagerRunner.__init__", "method",
         params=("self", "model_runner"), calls=("self.warmup",), required=False,
         purpose="where the kernel warmup first runs (before the prefill and decode runners)"),
    # ---- capture ---------------------------------------------------------------------------
    Seam("capture.model", _RUNNER, "ModelRunner.init_cuda_graphs", "method", params=("self",),
         calls=("capture_cuda_graphs",), assigns=("decode_cuda_graph_runner",),
         purpose="the capture phase; the region ends when it returns"),
    Seam("cg.runner_init", _DCGR, "DecodeCudaGraphRunner.__init__", "method", params=("self", "model_runner"),
         calls=("get_batch_sizes_to_capture", "resolve_decode_backend", "self.capture"),
         assigns=("capture_bs", "max_bs", "attn_backend", "backend"),
         purpose="the decode runner: capture sizes, attention backend and graph backend the capture seams read"),
    Seam("cg.capture", _DCGR, "DecodeCudaGraphRunner.capture", "method", params=("self",),
         purpose="SAVE: SGLang's own loop with graphs that keep their CUgraph, then save; LOAD: the same loop with "
                 "forwards and captures neutralised, restored graphs installed"),
    Seam("cg.freeze_gc", _DCGR, "freeze_gc", "function", params=("enable_cudagraph_gc",),
         defined_in="sglang.srt.model_executor.runner.base_cuda_graph_runner", required=False,
         purpose="LOAD: the capture loop's two full garbage collections are skipped (no forward runs)"),
    Seam("cg.capture_one_shape", _DCGR, "DecodeCudaGraphRunner.capture_one_shape", "method",
         params=("self", "size", "forward"),
         calls=("self.capture_prepare", "attn_backend.init_forward_metadata_out_graph", "self.backend.capture_one"),
         purpose="the per-shape metadata preparation LOAD keeps running in SGLang's order"),
    Seam("cg.graph_key", _DCGR, "DecodeCudaGraphRunner._make_graph_key", "method", params=("self", "size"),
         required=False, purpose="LOAD checks the archive holds every key SGLang will capture before the loop"),
    Seam("cg.graph_size", _DCGR, "DecodeCudaGraphRunner._capture_graph_size", "method", params=("self",),
         required=False, purpose="the size part of a graph key (bs, or tokens for ragged verify)"),
    Seam("cg.backend_select", _DCGR, "resolve_decode_backend", "function", params=("cuda_graph_runner",),
         defined_in="sglang.srt.model_executor.runner_backend.utils", calls=("FullCudaGraphBackend",),
         required=False,
         purpose="the decode backend is FullCudaGraphBackend (one torch CUDA graph per shape); the capture seam "
                 "refuses any other backend it finds"),
    Seam("cg.backend_init", _FCGB, "FullCudaGraphBackend.__init__", "method", params=("self", "cuda_graph_runner"),
         assigns=("_graphs", "_outputs", "_device_module"),
         purpose="the graph and output tables the plugin fills at LOAD"),
    Seam("cg.capture_one", _FCGB, "FullCudaGraphBackend.capture_one", "method",
         params=("self", "shape_key", "forward_fn"), calls=("torch.cuda.CUDAGraph", "forward_fn", "graph_ctx"),
         assigns=("_graphs", "_outputs"),
         purpose="warmup forwards (SAVE: paused; LOAD: skipped) and the capture through torch.cuda.CUDAGraph and "
                 "torch.cuda.graph, both looked up at call time"),
    Seam("cg.replay", _FCGB, "FullCudaGraphBackend.replay", "method", params=("self", "shape_key"),
         purpose="replays self._graphs[key] (restored graphs have .replay()) and returns self._outputs[key]"),
    # ---- breakable prefill graphs (prefill_patches.py, breaks.py) ------------------------------
    Seam("pcg.runner_init", _PCGR, "PrefillCudaGraphRunner.__init__", "method", params=("self", "model_runner"),
         calls=("resolve_prefill_backend", "self.capture"), assigns=("capture_num_tokens", "backend"),
         purpose="the prefill runner: its token counts and graph backend, then its capture (before the decode runner)"),
    Seam("pcg.capture", _PCGR, "PrefillCudaGraphRunner.capture", "method", params=("self",),
         purpose="SAVE: SGLang's prefill loop with segments that keep their CUgraph and eager calls paused; LOAD: "
                 "the same loop with each shape's capture replaced by SAVE's placements"),
    Seam("pcg.capture_one_shape", _PCGR, "PrefillCudaGraphRunner.capture_one_shape", "method",
         params=("self", "size"), calls=("self.capture_prepare", "self.backend.capture_one"),
         purpose="the per-shape static batch and metadata LOAD keeps preparing in SGLang's order"),
    Seam("pcg.freeze_gc", _PCGR, "freeze_gc", "function", params=("enable_cudagraph_gc",),
         defined_in="sglang.srt.model_executor.runner.base_cuda_graph_runner", required=False,
         purpose="LOAD: the prefill loop's two full garbage collections are skipped (no forward runs)"),
    Seam("bcg.backend_init", _BCGB, "BreakableCudaGraphBackend.__init__", "method",
         params=("self", "cuda_graph_runner"), assigns=("_graphs", "_outputs", "_capture_inputs"),
         purpose="the graph, output and capture-input tables the plugin fills at LOAD"),
    Seam("bcg.capture_one", _BCGB, "BreakableCudaGraphBackend.capture_one", "method",
         params=("self", "shape_key", "forward_fn", "capture_inputs", "post_warmup_hook"),
         calls=("BreakableCUDAGraph", "BreakableCUDAGraphCapture", "forward_fn"),
         purpose="warmup forwards (SAVE: paused; LOAD: skipped), the shared output buffer and the segmented "
                 "capture of one token count"),
    Seam("bcg.capture_class", _BCGB, "BreakableCUDAGraphCapture", "constant", defined_in=_BCG,
         purpose="looked up at call time by capture_one: SAVE swaps in a subclass that pauses the eager calls"),
    Seam("bcg.end_segment", _BCG, "BreakableCUDAGraphCapture._end_current_segment", "method", params=("self",),
         calls=("graph.capture_end",),
         purpose="ends a segment before an eager call (and at exit): SAVE pauses the region from here"),
    Seam("bcg.begin_segment", _BCG, "BreakableCUDAGraphCapture._begin_new_segment", "method", params=("self",),
         calls=("graph.capture_begin",),
         purpose="begins a segment (at enter and after an eager call): SAVE resumes the region first"),
    Seam("bcg.eager_on_graph", _BCG, "eager_on_graph", "function",
         calls=("captured_inner", "_copy_output", "capture.cuda_graph._break_fns.append"),
         purpose="the eager call between two prefill graph segments: a replay_fn closure over captured_inner, "
                 "captured_args, captured_kwargs and captured_output, which breaks.py describes and rebuilds"),
    Seam("bcg.copy_output", _BCG, "_copy_output", "function", params=("dst", "src"),
         purpose="copies an eager call's new result into its first output; a rebuilt call uses the same"),
    Seam("bcg.graph", _BCG, "BreakableCUDAGraph.__init__", "method", params=("self",),
         assigns=("_segments", "_break_fns"),
         purpose="the segments and the eager calls between them, which a restored prefill graph fills"),
    Seam("bcg.graph_replay", _BCG, "BreakableCUDAGraph.replay", "method", params=("self",), calls=("seg.replay",),
         purpose="replays each segment, then the eager call after it, on the current stream"),
    # ---- torch.compile (experimental): read for the mode check, never wrapped ---------------
    Seam("compile.mode_env", _TCD, "SGLANG_TORCH_COMPILE_MODE", "env", required=False,
         purpose="the torch.compile mode the mode check reads: modes that record CUDA-graph trees are refused"),
    Seam("compile.patch_model", _TCD, "patch_model", "function", params=("model", "enable_compile", "num_tokens"),
         calls=("torch.compile",), required=False,
         purpose="compiles model.forward for one decode size and yields it inside the capture loop only: replay "
                 "never calls it, so a LOAD that runs no forwards compiles nothing"),
    Seam("compile.decode_loop", _DCGR, "DecodeCudaGraphRunner._capture_one_stream", "method", params=("self",),
         calls=("torch_compile_decoration.patch_model",), required=False,
         purpose="the decode capture loop enters patch_model once per size"),
    Seam("out.logits_output", "sglang.srt.layers.logits_processor", "LogitsProcessorOutput.hidden_states",
         "constant",
         purpose="the decode graphs' output object (a dataclass), rebuilt at LOAD around the restored tensors"),
)

TABLE = SeamTable(
    engine="SGLang", package="sglang", tested_versions=TESTED_VERSIONS, seams=SEAMS,
    # Only read or recognised, never wrapped: load_plugins is called from other modules,
    # run_scheduler_process is a spawn target, not a call, and the breakable graph's functions are
    # read (eager_on_graph's closures) or called (_copy_output); torch.compile's are only checked;
    # parallel_state's switch and world group are only called.
    read_only_modules=("sglang.srt.plugins", _SCHEDULER, _BCG, _TCD, _PARALLEL_STATE),
)

BY_NAME: dict[str, Seam] = TABLE.by_name


# The seam called ``name`` (KeyError naming the known ones otherwise), and every file a seam may
# live in (relative path, module or package form; only some exist) for the source contract check.
seam = TABLE.seam
source_files = TABLE.source_files
