"""Every place where trtllm-foundry touches TensorRT-LLM, in one declarative list.

The patching code (``patching.py`` and the ``*_patches.py`` modules) looks seams up here by name,
the import hook (``importhook.py``) patches a module's seams right after that module is imported,
and the contract checks (``contract.py``, tests/engines/test_trtllm_contract.py) check this same
list against an installed TensorRT-LLM and against its release sources. The fields of a
:class:`foundry_core.engine.seam.Seam` are documented there; ``required=False`` marks a seam the
plugin can do without. :data:`READ_FROM` says, per seam, which TensorRT-LLM source it was read
from (docs/engine-trtllm.md describes those copies).

Why these attributes (a worker's start-up in TensorRT-LLM 1.2, in order):

- ``_TorchLLM._build_model`` (the ``LLM`` process, before the workers are spawned): unsupported
  settings are refused and the workers' environment is prepared;
- ``PyTorchModelEngine.__init__`` (in each worker, before the weights load): refusal again, the
  preload check, and the region (``session.begin()`` and the determinism boundary);
- ``KvCacheCreator.try_prepare_estimation`` / ``configure_kv_cache_capacity`` / ``build_managers`` /
  ``teardown_managers``: the KV-cache estimation pass (a throwaway executor whose warmup captures
  every graph once more, and a profiling run). SAVE runs it paused and records the KV size it chose;
  LOAD skips it with the recorded size and checks the KV cache it gets;
- ``PyTorchModelEngine.warmup`` / ``_run_autotuner_warmup`` / ``_run_cuda_graph_warmup``: the final
  executor's warmups. SAVE keeps the autotuner's cache and captures the graphs into an archive; LOAD
  loads the autotuner's cache, restores the graphs and ends the region when the warmup returns;
- ``CUDAGraphRunner.capture``: two eager warmup forwards, then one capture into the shared pool;
  ``graphs`` / ``graph_outputs`` / ``graph_metadata`` / ``memory_pool`` are the structures
  ``replay`` reads, which LOAD fills with the restored graphs.
"""

from __future__ import annotations

from foundry_core.engine.seam import KINDS, Seam, SeamTable

__all__ = ["KINDS", "Seam", "SEAMS", "TABLE", "TESTED_VERSIONS", "READ_FROM", "BY_NAME", "seam", "source_files"]

# What the seams were checked against, as SeamErrors quote it. They are written for 1.2.1, whose
# tag's tree was not readable where they were checked; READ_FROM names the copies that were
# (1.2-era main around the 1.2 branch point, version.py 1.2.0rc2). The contract test checks them
# against the v1.2.1 tag when it can reach GitHub.
TESTED_VERSIONS = ("1.2.0rc2 (1.2-era sources; 1.2.1 not yet checked)",)

_CGR = "tensorrt_llm._torch.pyexecutor.cuda_graph_runner"
_ENGINE = "tensorrt_llm._torch.pyexecutor.model_engine"
_UTIL = "tensorrt_llm._torch.pyexecutor._util"
_TUNER = "tensorrt_llm._torch.autotuner"
_LLM = "tensorrt_llm.llmapi.llm"
_SERVE = "tensorrt_llm.commands.serve"

SEAMS: tuple[Seam, ...] = (
    # ---- command line and the LLM process -------------------------------------------------------
    # Not required: without it --foundry-archive / --foundry-mode are not trtllm-serve options, and
    # FOUNDRY_ARCHIVE / FOUNDRY_MODE still work (as with LLM(...)).
    Seam("cli.serve", _SERVE, "serve", "function", params=("model",), required=False,
         purpose="the trtllm-serve click command: gets --foundry-archive and --foundry-mode"),
    Seam("llm.build_model", _LLM, "_TorchLLM._build_model", "method", params=("self",),
         calls=("self._executor_cls.create",), required=False,
         purpose="refuses unsupported settings and prepares the workers' environment before they start (the "
                 "worker refuses again, so the plugin is safe without it)"),
    # ---- the worker: model engine and region --------------------------------------------------------
    Seam("engine.init", _ENGINE, "PyTorchModelEngine.__init__", "method", params=("self", "model_path", "llm_args"),
         assigns=("cuda_graph_runner", "llm_args", "mapping"),
         purpose="refusal, the preload check and session.begin() before the weights load"),
    Seam("engine.warmup", _ENGINE, "PyTorchModelEngine.warmup", "method", params=("self", "resource_manager"),
         calls=("self._run_autotuner_warmup", "self._run_cuda_graph_warmup"),
         purpose="the final executor's warmups: the region ends when it returns"),
    Seam("engine.autotuner_warmup", _ENGINE, "PyTorchModelEngine._run_autotuner_warmup", "method",
         params=("self", "resource_manager"), calls=("autotune", "AutoTuner.get"),
         purpose="SAVE: the autotuner's cache file is kept for the archive (forward paused); LOAD: the cache is "
                 "loaded and the tuning forward skipped"),
    Seam("env.autotuner_cache", _ENGINE, "TLLM_AUTOTUNER_CACHE_PATH", "env",
         purpose="where _run_autotuner_warmup's autotune() reads and writes its cache (read at call time)"),
    Seam("engine.cuda_graph_warmup", _ENGINE, "PyTorchModelEngine._run_cuda_graph_warmup", "method",
         params=("self", "resource_manager"), calls=("self._capture_generation_cuda_graphs",),
         purpose="the decode capture loop: SAVE saves the captured graphs after it, LOAD restores the archive "
                 "before it and runs it without warmups or captures"),
    # ---- KV-cache sizing ------------------------------------------------------------------------------
    Seam("kv.prepare_estimation", _UTIL, "KvCacheCreator.try_prepare_estimation", "method", params=("self",),
         purpose="True starts the estimation pass; LOAD returns False with SAVE's KV size"),
    Seam("kv.configure", _UTIL, "KvCacheCreator.configure_kv_cache_capacity", "method",
         params=("self", "py_executor"),
         purpose="the profiling run of the estimation pass (SAVE: paused; LOAD: never reached)"),
    Seam("kv.build", _UTIL, "KvCacheCreator.build_managers", "method",
         params=("self", "resources", "estimating_kv_cache"), calls=("self._create_kv_cache_manager",),
         purpose="records the final KV cache's size (SAVE) and checks it (LOAD)"),
    Seam("kv.teardown", _UTIL, "KvCacheCreator.teardown_managers", "method", params=("self", "resources"),
         purpose="the end of the estimation pass: SAVE's pause ends when it returns"),
    # ---- autotuner -----------------------------------------------------------------------------------
    Seam("autotuner.get", _TUNER, "AutoTuner.get", "classmethod", params=("cls",),
         purpose="the process's autotuner (LOAD loads the archived cache into its profiling_cache)"),
    Seam("autotuner.setup", _TUNER, "AutoTuner.setup_distributed_state", "method", params=("self",),
         purpose="LOAD sets the mapping the cache's rank key comes from, as the skipped warmup did"),
    Seam("autotuner.load_cache", _TUNER, "AutoTunerProfilingCache.load_cache", "method", params=("self",),
         purpose="LOAD reads the archived cache file (path, rank), as autotune(cache_path=...) does"),
    # ---- CUDA-graph runner ---------------------------------------------------------------------------
    Seam("runner.init", _CGR, "CUDAGraphRunner.__init__", "method", params=("self", "config"),
         assigns=("graphs", "graph_outputs", "graph_metadata", "memory_pool", "shared_static_tensors"),
         purpose="the tables replay() reads, which LOAD fills with the restored graphs"),
    Seam("runner.warmup_steps", _CGR, "CUDAGraphRunner.WARMUP_STEPS", "constant",
         purpose="the eager forwards before each capture (SAVE: paused; LOAD: skipped)"),
    Seam("runner.capture", _CGR, "CUDAGraphRunner.capture", "method",
         params=("self", "key", "forward_fn", "initial_inputs"),
         calls=("torch.cuda.CUDAGraph", "torch.cuda.graph", "make_weak_ref"),
         purpose="SAVE: captures through Foundry's graph class (warmups paused) and records the graph, its "
                 "outputs and input addresses; LOAD: installs the restored graph instead"),
    Seam("runner.replay", _CGR, "CUDAGraphRunner.replay", "method", params=("self", "key"),
         purpose="copies the inputs into shared_static_tensors and replays graphs[key] (restored graphs have "
                 ".replay()), returning graph_outputs[key]"),
    Seam("runner.clear", _CGR, "CUDAGraphRunner.clear", "method", params=("self",),
         purpose="calls .reset() on every graph (restored graphs have it) and drops the pool"),
)

TABLE = SeamTable(
    engine="TensorRT-LLM", package="tensorrt_llm", tested_versions=TESTED_VERSIONS, seams=SEAMS,
    # Read, never wrapped by attribute: the click command gets two options in place.
    read_only_modules=(_SERVE,),
)

_ERA = "1.2-era source"
# Which TensorRT-LLM source each seam was read from (NVIDIA/TensorRT-LLM; docs/engine-trtllm.md).
READ_FROM: dict[str, str] = {
    "cli.serve": "newest stored tensorrt_llm/commands/serve.py (@click.command('serve'), 1.2-era layout)",
    "llm.build_model": f"{_ERA} tensorrt_llm/llmapi/llm.py (class _TorchLLM(BaseLLM))",
    "engine.init": f"{_ERA} model_engine.py (keyword-only model_path, llm_args; CUDAGraphRunner built in __init__)",
    "engine.warmup": f"{_ERA} model_engine.py (cp_size > 1 check, then the three warmups)",
    "engine.autotuner_warmup": f"{_ERA} model_engine.py",
    "env.autotuner_cache": f"{_ERA} model_engine.py (os.environ.get at call time)",
    "engine.cuda_graph_warmup": f"{_ERA} model_engine.py",
    "kv.prepare_estimation": f"{_ERA} _util.py (sets _kv_cache_config.max_tokens, returns True unless cp_type or "
                             "VANILLA)",
    "kv.configure": f"{_ERA} _util.py (writes _kv_cache_config.max_tokens and max_gpu_total_bytes)",
    "kv.build": f"{_ERA} _util.py",
    "kv.teardown": f"{_ERA} _util.py",
    "autotuner.get": f"{_ERA} autotuner.py (autotune(tune_mode, cache_path); load_cache(cache_path, rank))",
    "autotuner.setup": f"{_ERA} model_engine.py's call AutoTuner.get().setup_distributed_state(mapping, dist)",
    "autotuner.load_cache": f"{_ERA} autotuner.py",
    "runner.init": f"{_ERA} cuda_graph_runner.py (KeyType = Tuple[int, int, bool, bool])",
    "runner.warmup_steps": f"{_ERA} cuda_graph_runner.py (WARMUP_STEPS = 2)",
    "runner.capture": f"{_ERA} cuda_graph_runner.py",
    "runner.replay": f"{_ERA} cuda_graph_runner.py",
    "runner.clear": f"{_ERA} cuda_graph_runner.py",
}

BY_NAME: dict[str, Seam] = TABLE.by_name

# The seam called ``name`` (KeyError naming the known ones otherwise), and every file a seam may
# live in (relative path, module or package form; only some exist) for the source contract check.
seam = TABLE.seam
source_files = TABLE.source_files
