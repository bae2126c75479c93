"""The engines `foundry ready` starts: how to launch each, how to ask it for a completion, and the
log lines that mark its phases, in one declarative table.

Phases are seconds from exec, in this order (a start's time to ready is the last):

- ``first_line``: the server's first line of output (the first process's Python start-up and imports);
- ``worker_first_line``: the first line of the process that runs the model (vLLM's engine core,
  SGLang's scheduler): the first process's work until it starts that one, plus its imports;
- ``engine_init_end``: the engine's initialisation ends (weights, KV cache, compile, graphs);
- ``health``: ``/health`` answers 200 (from the client);
- ``first_completion``: a short greedy completion sent after ``/health`` came back (from the client).

The log formats were read in vLLM 0.25.0 and SGLang 0.5.17 (the files named beside each pattern).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

PHASES: tuple[str, ...] = ("first_line", "worker_first_line", "engine_init_end", "health", "first_completion")
PHASE_LABELS: dict[str, str] = {
    "first_line": "first log line",
    "worker_first_line": "worker's first line",
    "engine_init_end": "engine init end",
    "health": "/health 200",
    "first_completion": "first completion",
}
LOG_PHASES: tuple[str, ...] = PHASES[:3]  # the ones read from the log; the others come from the client
ANY_LINE = r"\S"

# Foundry's own lines (foundry_core/engine/session.py, the plugins' capture_patches.py): what a
# start did, so that a LOAD that fell back is not counted as a LOAD.
FOUNDRY_OUTCOMES: tuple[tuple[str, str], ...] = (
    ("fell back", r"foundry: rank \d+ (?:cannot load the archive|does not use the archive|could not save)"),
    ("restored", r"foundry: (?:rank \d+ )?restored \d+ (?:decode )?graphs"),
    ("saved", r"foundry: captured \d+ (?:decode )?graphs in [\d.]+ s,? saved|\bsaved \d+ graphs \(\d+ groups"),
)
FOUNDRY_MARKERS: dict[str, str] = {
    "foundry_restored": r"foundry: restored \d+ (?:decode )?graphs in",
    "foundry_captured": r"foundry: captured \d+ (?:decode )?graphs in",
    # foundry_core/engine/fork_server/client.py: the engine's child forked, not spawned
    "foundry_forked": r"foundry: \S+'s .+ is forked from the fork server",
}
FOUNDRY_DURATIONS: dict[str, str] = {
    "foundry_restore_s": r"foundry: restored \d+ (?:decode )?graphs in ([\d.]+) s",
    "foundry_capture_s": r"foundry: captured \d+ (?:decode )?graphs in ([\d.]+) s",
    "fork_server_import_s": r"is forked from the fork server \(which imported \S+ in ([\d.]+) s",
    # the part of those imports the fork server's driver watch took
    "fork_server_watch_s": r"is forked from the fork server .*its driver watch over \d+ imports: ([\d.]+) s",
}


@dataclass(frozen=True)
class Engine:
    """One engine. ``command`` is a template (``{python}``, ``{model}``) the harness appends the
    port, the Foundry flags and the user's arguments to; ``phases`` maps each log phase to the
    pattern of the first line that marks it; ``markers`` are more lines worth a time; ``durations``
    are times the engine reports itself (one number group each, seconds); ``warm_caches`` are
    (cache variable of caches.py, path below it) that a first start fills: the host is warm for
    this engine when each holds a file."""

    name: str
    distribution: str
    command: str
    completion_path: str
    completion_body: Mapping[str, object]
    phases: Mapping[str, str]
    markers: Mapping[str, str] = field(default_factory=dict)
    durations: Mapping[str, str] = field(default_factory=dict)
    warm_caches: tuple[tuple[str, str], ...] = ()
    health_path: str = "/health"


PROMPT = "hello world the model number 1 said"
COMPLETION_TOKENS = 8

VLLM = Engine(
    name="vllm",
    distribution="vllm",
    # `vllm serve` is vllm.entrypoints.cli.main:main; through -m it runs under the chosen Python.
    command="{python} -m vllm.entrypoints.cli.main serve {model}",
    completion_path="/v1/completions",  # `model` is optional there (openai/completion/protocol.py)
    completion_body={"prompt": PROMPT, "max_tokens": COMPLETION_TOKENS, "temperature": 0.0},
    phases={
        "first_line": ANY_LINE,
        # utils/system_utils.py decorate_logs: "(EngineCore pid=N) " or "(EngineCore_DP0 pid=N) "
        # (engine/utils.py names the process), added once the engine core process runs.
        "worker_first_line": r"^\(EngineCore(?:_DP\d+)? pid=\d+\)",
        # v1/engine/core.py _initialize_kv_caches
        "engine_init_end": r"init engine \(profile, create kv cache, warmup model\) took",
    },
    markers={
        "args_line": r"non-default args:",  # entrypoints/serve/utils/api_utils.py
        "engine_core_init": r"Initializing a V1 LLM engine",  # v1/engine/core.py
        "weights_loaded": r"Model loading took",  # v1/worker/gpu_model_runner.py
        "app_startup_complete": r"Application startup complete",  # uvicorn, in the API server
        **FOUNDRY_MARKERS,
    },
    durations={
        "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
        "compilation_s": r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s "
                         r"\(compilation: ([\d.]+) s",
        "model_loading_s": r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds",
        "torch_compile_s": r"torch\.compile took ([\d.]+) s in total",  # compilation/monitor.py
        "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
        **FOUNDRY_DURATIONS,
    },
    warm_caches=(("VLLM_CACHE_ROOT", "torch_compile_cache"),),
)

# SGLang's scheduler logs with a prefix only where there are ranks to tell apart (managers/
# scheduler.py run_scheduler_process: " TP0", " DP0", ... in "[%(asctime)s<prefix>] ",
# utils/common.py configure_logger); with one GPU its first line is distributed/bootstrap.py's.
_SGLANG_RANK_PREFIX = r"^\[[\d-]+ [\d:.]+ (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+"

SGLANG = Engine(
    name="sglang",
    distribution="sglang",
    command="{python} -m sglang.launch_server --model-path {model}",
    completion_path="/generate",
    completion_body={"text": PROMPT, "sampling_params": {"max_new_tokens": COMPLETION_TOKENS, "temperature": 0.0}},
    phases={
        "first_line": ANY_LINE,
        "worker_first_line": _SGLANG_RANK_PREFIX + r"|Init torch distributed begin\.",
        # entrypoints/engine.py _set_startup_time, in the first process once every scheduler is ready
        "engine_init_end": r"Engine startup timings \(s\):",
    },
    markers={
        "server_args_line": r"server_args=ServerArgs\(",  # entrypoints/engine.py
        "weights_loaded": r"Load weight end\.",  # model_executor/model_runner.py
        # model_executor/model_runner_components/cuda_graph_setup.py
        "decode_graphs_end": r"Capture \w+ decode CUDA graph end\.",
        "fired_up": r"The server is fired up and ready to roll!",  # entrypoints/http_server.py
        **FOUNDRY_MARKERS,
    },
    durations={
        "scheduler_e2e_s": r"scheduler_e2e=([\d.]+)",
        "load_weight_s": r"Engine startup timings \(s\): load_weight=([\d.]+)",
        "kv_cache_allocation_s": r"kv_cache_allocation=([\d.]+)",
        "cuda_graph_prefill_s": r"cuda_graph=\{(?:[^}]*[ ,])?prefill=([\d.]+)",
        "cuda_graph_decode_s": r"cuda_graph=\{(?:[^}]*[ ,])?decode=([\d.]+)",
        "tokenizer_e2e_s": r"tokenizer_e2e=([\d.]+)",
        "decode_graph_capture_s": r"Capture \w+ decode CUDA graph end\. elapsed=([\d.]+) s",
        "init_torch_distributed_s": r"Init torch distributed ends\. elapsed=([\d.]+) s",
        **FOUNDRY_DURATIONS,
    },
    warm_caches=(("TVM_FFI_CACHE_DIR", ""), ("FLASHINFER_WORKSPACE_BASE", ".cache/flashinfer")),
)

ENGINES: dict[str, Engine] = {e.name: e for e in (VLLM, SGLANG)}


def engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})") from None


def compiled(patterns: Mapping[str, str]) -> dict[str, re.Pattern[str]]:
    return {name: re.compile(p) for name, p in patterns.items()}
