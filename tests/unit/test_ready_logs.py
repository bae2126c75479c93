"""`foundry ready`'s log reading: the engines' phase lines, the durations they report and what
Foundry did, on log text in the engines' formats (vLLM 0.25.0, SGLang 0.5.17; the figures are the
ones bench/results and issue 28 recorded)."""

from __future__ import annotations

import pytest

from foundry_core.ready import engines, logparse

VLLM_LOG = [
    (21.204, "INFO 11-30 10:36:13 [__init__.py:246] Automatically detected platform cuda."),
    (21.950, "(APIServer pid=4100) INFO 11-30 10:36:34 [api_utils.py:273] non-default args: {'model': "
             "'/tmp/tiny-qwen3', 'host': '127.0.0.1', 'port': 30711, 'load_format': 'dummy'}"),
    (22.010, "(APIServer pid=4100) INFO 11-30 10:36:34 [model.py:619] Resolved architecture: Qwen3ForCausalLM"),
    (44.870, "(EngineCore pid=4321) INFO 11-30 10:36:57 [core.py:115] Initializing a V1 LLM engine (v0.25.0) "
             "with config: model='/tmp/tiny-qwen3', speculative_config=None"),
    (46.100, "(EngineCore pid=4321) INFO 11-30 10:36:58 [gpu_model_runner.py:5307] Model loading took 0.07 GiB "
             "memory and 0.853211 seconds"),
    (46.500, "(EngineCore pid=4321) INFO 11-30 10:36:58 [worker.py:211] foundry: KV cache of 74112194048 bytes, "
             "as recorded at SAVE"),
    (47.300, "(EngineCore pid=4321) INFO 11-30 10:36:59 [capture_patches.py:263] foundry: restored 67 graphs in "
             "0.17 s (instantiate=eager; images 0.00 s, build 0.02 s, deltas 0.01 s, instantiate 0.12 s) instead "
             "of capturing"),
    (47.900, "(EngineCore pid=4321) INFO 11-30 10:37:00 [core.py:338] init engine (profile, create kv cache, "
             "warmup model) took 2.89 s (compilation: 0.39 s)"),
    (49.800, "(APIServer pid=4100) INFO 11-30 10:37:02 [api_server.py:616] Starting vLLM server on "
             "http://127.0.0.1:30711"),
    (50.200, "(APIServer pid=4100) INFO:     Application startup complete."),
]

SGLANG_LOG = [
    (29.800, "[2026-11-29 10:36:13] server_args=ServerArgs(model_path='/tmp/tiny-qwen3', tokenizer_path="
             "'/tmp/tiny-qwen3', attention_backend='triton', sampling_backend='pytorch')"),
    (58.400, "[2026-11-29 10:36:40] Init torch distributed begin."),
    (58.800, "[2026-11-29 10:36:41] Init torch distributed ends. elapsed=0.35 s, mem usage=0.09 GB"),
    (60.100, "[2026-11-29 10:36:43] Load weight end. elapsed=0.52 s, type=Qwen3ForCausalLM, avail mem=138.80 GB, "
             "mem usage=0.40 GB."),
    (61.000, "[2026-11-29 10:36:44] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
             "bs=[1, 2, 4, 8, 16, 32], avail mem=70.00 GB"),
    (64.300, "[2026-11-29 10:36:47] Capture target decode CUDA graph end. elapsed=3.24 s, mem usage=0.12 GB, "
             "avail mem=69.88 GB."),
    (65.200, "[2026-11-29 10:36:48] Engine startup timings (s): load_weight=0.52, kv_cache_allocation=0.31, "
             "scheduler_e2e=8.07, cuda_graph={prefill=0.00, decode=3.24, target_verify=0.00, draft_prefill=0.00, "
             "draft_decode=0.00, draft_extend=0.00}, tokenizer_e2e=35.50"),
    (66.900, "[2026-11-29 10:36:50] INFO:     Application startup complete."),
    (68.100, "[2026-11-29 10:36:52] The server is fired up and ready to roll!"),
]


@pytest.mark.parametrize("engine, log, phases, markers, durations, foundry", [
    # vLLM: the engine core's first line, then its "init engine ... took".
    (engines.VLLM, VLLM_LOG, {"first_line": 21.204, "worker_first_line": 44.870, "engine_init_end": 47.900},
     {"args_line": 21.950, "app_startup_complete": 50.200, "foundry_restored": 47.300},
     {"init_engine_s": 2.89, "compilation_s": 0.39, "model_loading_s": 0.853211, "foundry_restore_s": 0.17},
     "restored"),
    # SGLang on one GPU: its scheduler's lines carry no rank, so it starts at "Init torch distributed".
    (engines.SGLANG, SGLANG_LOG, {"first_line": 29.800, "worker_first_line": 58.400, "engine_init_end": 65.200},
     {"server_args_line": 29.800, "decode_graphs_end": 64.300, "fired_up": 68.100},
     {"scheduler_e2e_s": 8.07, "load_weight_s": 0.52, "kv_cache_allocation_s": 0.31, "cuda_graph_prefill_s": 0.0,
      "cuda_graph_decode_s": 3.24,
      "tokenizer_e2e_s": 35.50, "decode_graph_capture_s": 3.24, "init_torch_distributed_s": 0.35},
     "-"),
])
def test_phases_markers_and_durations_of_a_start(engine, log, phases, markers, durations, foundry):
    found = logparse.parse(engine, log)
    assert found.phases == phases
    assert {name: found.markers.get(name) for name in markers} == markers
    assert found.durations == durations
    assert found.foundry == foundry


@pytest.mark.parametrize("engine, line", [
    (engines.VLLM, "(APIServer pid=4100) INFO 12-03 11:02:13 [client.py:150] foundry: vLLM's engine core is forked from "
                   "the fork server (which imported vLLM in 17.42 s, its checks after the imports included: 0.01 s)"),
    (engines.SGLANG, "[2026-12-03 11:02:13] foundry: SGLang's scheduler is forked from the fork server (which imported "
                     "SGLang in 17.42 s, its checks after the imports included: 0.01 s, its driver watch over 8123 "
                     "imports: 0.31 s)"),
])
def test_a_child_forked_from_the_fork_server_is_marked_with_the_servers_import_time(engine, line):
    found = logparse.parse(engine, [(30.5, line)])
    assert found.markers["foundry_forked"] == 30.5
    assert found.durations["fork_server_import_s"] == 17.42
    assert found.durations.get("fork_server_watch_s") == (0.31 if engine is engines.SGLANG else None)  # older line


def test_a_spawned_child_is_not_marked_forked():
    line = ("foundry: vLLM's engine core is spawned, not forked from the fork server: the fork server is not safe "
            "to fork from: the imports started threads in the fork server (x)")
    found = logparse.parse(engines.VLLM, [(30.5, line)])
    assert "foundry_forked" not in found.markers and "fork_server_import_s" not in found.durations


def test_vllm_data_parallel_engine_core_prefix_counts_as_the_worker():
    lines = [(1.0, "(APIServer pid=1) INFO 11-30 10:36:34 [api_utils.py:273] non-default args: {}"),
             (9.5, "(EngineCore_DP0 pid=7) INFO 11-30 10:36:57 [core.py:115] Initializing a V1 LLM engine")]
    assert logparse.parse(engines.VLLM, lines).phases["worker_first_line"] == 9.5


def test_vllm_lines_in_colour_match_too():
    coloured = [(3.0, "\x1b[36m(EngineCore pid=4321)\x1b[0m \x1b[32mINFO\x1b[0m 11-30 10:37:00 [core.py:345] init "
                      "engine (profile, create kv cache, warmup model) took 48.07 s")]
    found = logparse.parse(engines.VLLM, coloured)
    assert found.phases["worker_first_line"] == 3.0
    assert found.durations["init_engine_s"] == 48.07
    assert "compilation_s" not in found.durations


def test_sglang_cuda_graph_phases_are_not_the_draft_ones():
    line = [(1.0, "[2026-11-29 10:36:48] Engine startup timings (s): load_weight=0.52, kv_cache_allocation=0.31, "
                  "scheduler_e2e=4.69, cuda_graph={draft_prefill=8.88, draft_decode=9.99, decode=0.21, prefill=0.07}, "
                  "tokenizer_e2e=30.00")]
    durations = logparse.parse(engines.SGLANG, line).durations
    assert (durations["cuda_graph_prefill_s"], durations["cuda_graph_decode_s"]) == (0.07, 0.21)


def test_sglang_tensor_parallel_scheduler_is_its_first_prefixed_line():
    lines = [(30.0, "[2026-11-29 10:36:13] server_args=ServerArgs(model_path='/m', tp_size=2)"),
             (57.0, "[2026-11-29 10:36:39 TP1] Using default MoE kernel config."),
             (58.0, "[2026-11-29 10:36:40 TP0] Init torch distributed begin.")]
    assert logparse.parse(engines.SGLANG, lines).phases["worker_first_line"] == 57.0


@pytest.mark.parametrize("line, outcome", [
    ("[2026-11-29 10:36:47] foundry: captured 8 decode graphs in 1.69 s, saved 8 graphs to /a/rank0 in 0.06 s",
     "saved"),
    ("(EngineCore pid=9) INFO 11-30 10:37:00 [capture_patches.py:155] foundry: captured 67 graphs in 3.07 s, "
     "saved in 0.41 s", "saved"),
    ("[2026-11-29 10:36:47] foundry: restored 8 decode graphs in 0.13 s (instantiate=eager; images 0.08 s) "
     "instead of capturing", "restored"),
    ("[2026-11-29 10:36:44] foundry: rank 0 cannot load the archive (/a/rank0/graphs.fgr: section 5 (type 2): "
     "checksum mismatch); starting normally without it, the archive is left as is", "fell back"),
    ("[2026-11-29 10:36:44] foundry: rank 0 does not use the archive (/a is stale: engine.model_hash); "
     "starting normally", "fell back"),
    ("(EngineCore pid=9) INFO 11-30 10:37:00 [capture_patches.py:155] foundry: captured 67 graphs in 3.07 s; "
     "the archive was not saved", "-"),
])
def test_foundry_outcome(line, outcome):
    assert logparse.parse(engines.SGLANG, [(1.0, line)]).foundry == outcome


def test_a_fallback_outweighs_the_fresh_save_after_it():
    lines = [(1.0, "foundry: rank 0 does not use the archive (stale); starting normally and saving a fresh one"),
             (2.0, "foundry: captured 8 decode graphs in 1.84 s, saved 8 graphs to /a in 0.06 s")]
    assert logparse.parse(engines.SGLANG, lines).foundry == "fell back"


def test_stamped_log_round_trip(tmp_path):
    path = tmp_path / "start.log"
    path.write_text("".join(logparse.stamp(t, line) + "\n" for t, line in VLLM_LOG))
    assert logparse.read_stamped(path) == VLLM_LOG


def test_a_log_without_stamps_is_refused(tmp_path):
    path = tmp_path / "raw.log"
    path.write_text("INFO 11-30 10:36:13 [__init__.py:246] Automatically detected platform cuda.\n")
    with pytest.raises(ValueError, match="raw.log:1: not a stamped line"):
        logparse.read_stamped(path)


def test_every_engine_has_a_pattern_for_each_log_phase():
    for engine in engines.ENGINES.values():
        assert set(engine.phases) == set(engines.LOG_PHASES), engine.name


# Foundry's critical-path lines (foundry_core/engine/critical_path.py): the engine core's rank at the
# end of its start-up phase, the API server's (no rank) when it exits.
CRITICAL_LINES = [
    (47.950, "(EngineCore pid=4321) INFO 11-30 10:37:00 [worker.py:282] foundry: critical path in this process "
             "(rank 0): 0.052 s (plugin import 0.004, seams 0.006, fingerprint 0.003, archive check 0.011, host "
             "caches 0.008, images wait 0.020); overlapped, not in the total: images thread cpu 0.095"),
    (61.000, "(APIServer pid=4100) INFO 11-30 10:37:14 [critical_path.py:171] foundry: critical path in this "
             "process: 0.081 s (restart 0.062, early start 0.008, plugin import 0.007, seams 0.004)"),
]


def test_foundry_critical_path_is_the_first_process_plus_the_rank():
    found = logparse.parse(engines.VLLM, VLLM_LOG + CRITICAL_LINES)
    assert found.critical is not None
    assert found.critical.total == pytest.approx(0.133) and found.critical.lines == 2
    assert found.critical.items == pytest.approx({
        "plugin import": 0.011, "seams": 0.010, "fingerprint": 0.003, "archive check": 0.011, "host caches": 0.008,
        "images wait": 0.020, "restart": 0.062, "early start": 0.008})
    assert found.critical.overlapped == pytest.approx({"images thread cpu": 0.095})
    assert {len(VLLM_LOG), len(VLLM_LOG) + 1} <= found.matched_lines  # kept by keep_logs=tail
    assert logparse.parse(engines.VLLM, VLLM_LOG).critical is None  # an unmodified start logs none


def test_of_two_ranks_the_slower_one_counts():
    lines = [(1.0, "[2026-11-29 10:36:47 TP0] foundry: critical path in this process (rank 0): 0.050 s "
                   "(archive check 0.050)"),
             (1.1, "[2026-11-29 10:36:47 TP1] foundry: critical path in this process (rank 1): 0.070 s "
                   "(archive check 0.030, host caches 0.040)")]
    critical = logparse.parse(engines.SGLANG, lines).critical
    assert critical.total == pytest.approx(0.070)
    assert critical.items == pytest.approx({"archive check": 0.030, "host caches": 0.040})


@pytest.mark.parametrize("line, kept", [
    ("(EngineCore pid=9) WARNING 12-03 11:02:13 [host_caches.py:90] foundry: 2 files in the Triton cache were "
     "not placed by it", True),
    ("[2026-12-03 11:02:13] Foundry: placed 3 host cache files from the archive", True),
    ("(EngineCore pid=9) INFO 12-03 11:02:13 [activation.py:40] vllm_foundry: active", True),
    ("\x1b[33mWARNING\x1b[0m 12-03 11:02:13 [cuda.py:1] a warning of the engine's own", True),
    ("Traceback (most recent call last):", True),
    ("(APIServer pid=4100) DEBUG 12-03 11:02:13 [loader.py:1] loading shard 3 of 4", False),
    ("(APIServer pid=4100) INFO 12-03 11:02:13 [x.py:1] a warning in lower case is not one", False),
    ("INFO 12-03 11:02:13 [foundry.sglang] restored 3 graphs", True),
    ("[2026-12-03] compiling into /tmp/foundry-ready-x1/starts/03/caches/triton/ab12", False),
])
def test_a_trimmed_log_always_keeps_foundrys_lines_warnings_and_tracebacks(line, kept):
    assert logparse.always_kept(line) is kept
