"""sglang-foundry's breakable prefill CUDA graphs (prefill_patches.py) over the fake SGLang of
test_sglang_plugin.py: naming and the per-shape claims (pure), what SAVE keeps of a segmented graph,
the pauses around the eager calls, and SAVE then LOAD of a scheduler start with prefill graphs on,
with its fallbacks.

The fake's prefill forward runs two layers, each with one attention call decorated with SGLang's
``eager_on_graph`` (``sglang.srt.layers.radix_attention:breakable_attention``), so each token
count's graph is three segments with two eager calls between them. Its allocations go through a
FakeMemory: in the region while it is set and not paused, elsewhere otherwise."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import types

import pytest

from foundry_core.engine import Mode
from foundry_core.engine.layout import rank_dir
from foundry_core.engine.state import read_state
from foundry_core.errors import UnsupportedError

import test_sglang_plugin as plugin_tests  # first: it finds the plugin's source tree when it is not installed
from test_sglang_plugin import BLAS_WORKSPACE, NAMES, RNG_STATE, FakeCUDAGraph, FakeMemory, FakeTensor, KeepGraph

from sglang_foundry import capture_patches, prefill_patches, seams


# The fake SGLang's fixtures (pytest takes a module's fixtures from its attributes).
clean_state, fake_torch, fake_sglang = plugin_tests.clean_state, plugin_tests.fake_torch, plugin_tests.fake_sglang
scheduler = plugin_tests.scheduler

PREFILL = {"disable_prefill_cuda_graph": False}  # SGLang's default: breakable prefill graphs
SHAPES = [f"size={n},stream_idx=None,variant_label=None" for n in (32, 16)]  # SGLang captures the largest first
SEGMENTS = [prefill_patches.segment_name(shape, i, 3) for shape in SHAPES for i in range(3)]
ATTENTION = "sglang.srt.layers.radix_attention:breakable_attention"
BCG = seams.seam("bcg.graph").module


def events(log: list, kind: str) -> list[tuple]:
    return [e for e in log if isinstance(e, tuple) and e[0] == kind]


def claims_of(run) -> list[tuple[str, int, int]]:
    return [e for e in run.dev if isinstance(e, tuple) and e[0] == "claim"]


def recorded_claims(state) -> list[tuple[str, int, int]]:
    return [("claim", offset, size) for shape in SHAPES for offset, size in state["prefill"]["shapes"][shape]["claims"]]


def saved_archive(scheduler) -> dict:
    return scheduler.io.saved[rank_dir(scheduler.archive, 0)]


def fallbacks(run) -> list[str]:
    return run.rt.adapter.fallback_reasons


# ---- naming and claims (pure) ------------------------------------------------------------------


def test_segment_names_carry_the_shape_and_the_position():
    name = prefill_patches.segment_name(SHAPES[1], 1, 3)
    assert name == "bcg:size=16,stream_idx=None,variant_label=None:1/3"
    assert prefill_patches.is_prefill_graph(name)
    assert not any(prefill_patches.is_prefill_graph(n) for n in NAMES)  # decode graphs
    assert prefill_patches.PREFIX == capture_patches.PREFILL_PREFIX  # the decode checks skip exactly these


def test_window_claims_keep_each_shapes_blocks_in_order():
    windows = {"a": (2, 6), "b": (6, 9), "c": (9, 9)}
    events_ = [(0, "alloc", 0x0, 0x200),      # before the first window (the shape's preparation)
               (2, "alloc", 0x200, 0x400), (3, "free", 0x0, 0x200),  # freeing a block no window allocated
               (5, "alloc", 0x600, 0x200), (6, "alloc", 0x800, 0x200), (8, "alloc", 0xa00, 0x600),
               (9, "alloc", 0x1000, 0x200)]   # after the last window
    assert prefill_patches.window_claims(windows, events_) == {
        "a": [[0x200, 0x400], [0x600, 0x200]], "b": [[0x800, 0x200], [0xa00, 0x600]], "c": []}


@pytest.mark.parametrize("freed_at", [5, 7, 12])  # in its own window, in the next one, after the last
def test_window_claims_refuse_a_block_freed_before_the_loop_ended(freed_at):
    windows = {SHAPES[0]: (2, 6), SHAPES[1]: (6, 9)}
    events_ = [(3, "alloc", 0x4000, 0x200), (4, "alloc", 0x4200, 0x200), (freed_at, "free", 0x4200, 0x200)]
    with pytest.raises(UnsupportedError, match=rf"prefill capture of {SHAPES[0]} .*0x4200.*freed again"):
        prefill_patches.window_claims(windows, sorted(events_))


def test_the_plan_needs_the_archives_prefill_record_for_the_same_token_counts():
    runner = types.SimpleNamespace(capture_num_tokens=[16, 32])
    for recorded in (None, {}, {"shapes": None}, {"tokens": [16, 32]}):
        assert "holds no prefill graphs" in prefill_patches._plan_problem(runner, recorded), recorded
    assert prefill_patches._plan_problem(runner, {"shapes": {}, "tokens": [16, 32]}) is None
    problem = prefill_patches._plan_problem(runner, {"shapes": {}, "tokens": [16]})
    assert "2 token counts (up to 32)" in problem and "the archive for 1" in problem
    assert "for None" in prefill_patches._plan_problem(runner, {"shapes": {}})


# ---- what SAVE keeps of a segmented graph ---------------------------------------------------------


def capture_two_layers(fake_sglang, n: int = 16) -> tuple[object, list[tuple]]:
    """A BreakableCUDAGraph captured by the fake SGLang around two eager attention calls; returns it
    and the arguments of each call."""
    bcg, attention = fake_sglang[BCG], fake_sglang["sglang.srt.layers.radix_attention"]
    graph = bcg.BreakableCUDAGraph()
    calls = []
    with bcg.BreakableCUDAGraphCapture(cuda_graph=graph):
        for layer in range(2):
            base = 0x10000 * (layer + 1)
            args = (FakeTensor(base, (n, 64)), FakeTensor(base + 0x1000, (n, 8)), FakeTensor(base + 0x2000, (n, 8)),
                    FakeTensor(base + 0x3000, (n, 64)), True, layer)
            attention.breakable_attention(*args)
            calls.append(args)
    return graph, calls


def test_collect_saves_each_eager_calls_tensors_with_the_segment_before_it(fake_sglang):
    graph, calls = capture_two_layers(fake_sglang)
    key = fake_sglang["sglang.srt.model_executor.runner.shape_key"].ShapeKey(size=16)
    output = FakeTensor(0x90000, (16, 64))
    backend = types.SimpleNamespace(_graphs={key: graph}, _outputs={key: output})
    saved = prefill_patches.collect(backend, {SHAPES[1]: [[0x0, 0x200]]}, prefill_patches._decorated())

    names = [prefill_patches.segment_name(SHAPES[1], i, 3) for i in range(3)]
    assert list(saved.graphs) == names
    assert [saved.graphs[n][0] for n in names] == graph._segments and all(
        type(s) is FakeCUDAGraph for s in graph._segments)
    for i, args in enumerate(calls):
        assert saved.graphs[names[i]][1] == args[:4]  # q, k, v, output: the call after segment i
    assert saved.graphs[names[2]][1] == (output,)  # the last segment: the graph's output
    record = saved.state["shapes"][SHAPES[1]]
    assert saved.state["backend"] == "breakable"
    assert record["segments"] == 3 and record["claims"] == [[0x0, 0x200]] and record["output"] == {"kind": "tensor"}
    assert [b["function"] for b in record["breaks"]] == [ATTENTION, ATTENTION]  # the decorated module attribute
    assert [b["args"][4:] for b in record["breaks"]] == [[{"value": True}, {"value": 0}],
                                                         [{"value": True}, {"value": 1}]]
    assert record["breaks"][0]["args"][:4] == [{"tensor": i} for i in range(4)]


def test_collect_refuses_segments_without_one_eager_call_between_each_two(fake_sglang):
    graph, _ = capture_two_layers(fake_sglang)
    graph._break_fns.pop()
    key = fake_sglang["sglang.srt.model_executor.runner.shape_key"].ShapeKey(size=16)
    backend = types.SimpleNamespace(_graphs={key: graph}, _outputs={key: FakeTensor(0x90000)})
    with pytest.raises(UnsupportedError, match=rf"{SHAPES[1]} has 3 segments and 1 eager calls"):
        prefill_patches.collect(backend, {}, prefill_patches._decorated())


# ---- SAVE: the eager calls between segments run paused -------------------------------------------


class PauseRecorder:
    """A runtime whose paused() records where it begins and ends in the fake SGLang's LOG."""

    def __init__(self, log: list):
        self.log = log

    @contextlib.contextmanager
    def paused(self):
        self.log.append("pause")
        try:
            yield
        finally:
            self.log.append("resume")


def test_the_pausing_capture_pauses_between_segments_only(fake_sglang):
    bcg, attention = fake_sglang[BCG], fake_sglang["sglang.srt.layers.radix_attention"]
    log = fake_sglang["LOG"]
    loop = prefill_patches.PrefillLoop(runner=None)
    capture_class = prefill_patches.pausing(bcg.BreakableCUDAGraphCapture, PauseRecorder(log), loop)
    assert issubclass(capture_class, bcg.BreakableCUDAGraphCapture)
    assert capture_class.__name__ == "BreakableCUDAGraphCapture"
    graph = bcg.BreakableCUDAGraph()
    capturing = []
    assert not loop.capturing
    with capture_class(cuda_graph=graph):
        for layer in range(2):
            capturing.append(loop.capturing)
            attention.breakable_attention(FakeTensor(0x1000), None, None, FakeTensor(0x2000), False, layer)
        capturing.append(loop.capturing)
    assert capturing == [True, True, True] and not loop.capturing
    shown = [e if isinstance(e, str) else e[0] for e in log]
    segment = ["segment_begin", "segment_end"]
    assert shown.pop(1) == "rng_state"  # the first segment registers the generator, as PyTorch's capture_begin does
    assert shown == [*segment, "pause", "attention", "resume", *segment, "pause", "attention", "resume", *segment]
    assert len(graph._segments) == 3 and len(graph._break_fns) == 2


def test_a_failing_eager_call_still_resumes_the_region(fake_sglang):
    bcg = fake_sglang[BCG]
    log = fake_sglang["LOG"]
    loop = prefill_patches.PrefillLoop(runner=None)
    capture_class = prefill_patches.pausing(bcg.BreakableCUDAGraphCapture, PauseRecorder(log), loop)

    def broken(*_args):
        raise RuntimeError("attention failed")

    capture = capture_class(cuda_graph=bcg.BreakableCUDAGraph())  # kept: its pause must not end only when collected
    # SGLang's __exit__ then fails on the segment the eager call had ended (its own behaviour).
    with pytest.raises((RuntimeError, AssertionError)), capture:
        bcg.eager_on_graph(True)(broken)(FakeTensor(0x1000))
    assert log.count("pause") == log.count("resume") == 1 and not loop.capturing
    assert capture._foundry_pause is None


# ---- SAVE then LOAD over the fake SGLang --------------------------------------------------------


def test_save_captures_the_prefill_graphs_and_saves_them_with_the_decode_graphs(scheduler):
    save = scheduler("save", **PREFILL)
    log, memory, state = save.log, save.memory, save.rt.adapter.state
    runner = save.runner.prefill_cuda_graph_runner
    # SGLang's prefill loop, before the decode loop: per token count, two warmups and one captured forward.
    assert log.index(("prefill_prepare", 32)) < log.index(("prepare", 8))
    assert events(log, "prefill_forward") == [("prefill_forward", 32)] * 3 + [("prefill_forward", 16)] * 3
    assert len(events(log, "attention")) == 12  # two layers per forward, eagerly, also in the captured one
    assert events(log, "segment_begin") == [("segment_begin", "KeepGraph")] * 6  # Foundry's graph class
    # Paused: profiling, the kernel warmup, the 8 decode warmups, 4 prefill warmups and 4 eager calls.
    assert save.dev.count("stop_region") == 18 and save.dev.count("resume_region") == 18
    # So the warmups' and the eager calls' temporaries stayed out of the region.
    assert all(e[-1] < FakeMemory.BASE for e in events(log, "attention"))

    saved = saved_archive(scheduler)
    assert list(saved) == NAMES + SEGMENTS == state["graphs"] + SEGMENTS  # one archive
    attention = events(log, "attention")
    captured = attention[4:6] + attention[10:12]  # per shape: two warmup forwards, then the captured one
    for (shape, i), call in zip([(s, i) for s in SHAPES for i in range(2)], captured):
        assert saved[prefill_patches.segment_name(shape, i, 3)] == call[2:6]  # q, k, v, output of the call after it
        assert all(memory.BASE <= t.data_ptr() < memory.BASE + memory.cursor for t in call[2:6])
    backend = runner.backend
    for shape, key in zip(SHAPES, backend._graphs):
        assert saved[prefill_patches.segment_name(shape, 2, 3)] == (backend._outputs[key],)
        assert all(type(s) is KeepGraph for s in backend._graphs[key]._segments)

    prefill = state["prefill"]
    assert prefill["tokens"] == [16, 32] and prefill["backend"] == "breakable"
    big, small = (prefill["shapes"][s] for s in SHAPES)
    assert [b["function"] for b in big["breaks"] + small["breaks"]] == [ATTENTION] * 4
    # Each shape's region blocks, in order: the first one's cuBLAS workspace, the generator's
    # graph-safe RNG state (registered before the warmups, so no capture allocates it) and the shared
    # output buffer, then what its segments allocated (the hidden state, then q, k, v, output per layer).
    assert events(log, "rng_state") == [("rng_state", "generator 0")]
    assert log.index("blas_handle") < log.index(("rng_state", "generator 0")) < log.index(("prefill_forward", 32))
    output = backend._outputs[next(iter(backend._graphs))]
    assert [size for _, size in big["claims"][:2]] == [BLAS_WORKSPACE, RNG_STATE]
    assert big["claims"][2][0] == memory.offset(output)
    assert len(big["claims"]) == 3 + 9 and len(small["claims"]) == 9
    blocks = [offset for offset, _ in big["claims"] + small["claims"]]
    assert blocks == sorted(blocks)
    # Everything else in the region was placed outside capture_one: the static inputs, each shape's
    # metadata, and the decode loop's cuBLAS workspace.
    others = [runner.input_ids, *runner.capture_metadata.values()]
    unclaimed = sorted({e.offset for e in memory.log if e.kind == "alloc"} - set(blocks))
    assert unclaimed[:3] == sorted(memory.offset(t) for t in others) and len(unclaimed) == 4
    end = small["claims"][-1][0] + small["claims"][-1][1]
    assert prefill["region"] == [end, end] and unclaimed[3] == end  # the layout right after the prefill loop
    assert save.rt.saved and read_state(rank_dir(scheduler.archive, 0)).adapter["prefill"] == prefill


def test_load_places_saves_blocks_and_installs_the_restored_prefill_graphs(scheduler, caplog):
    save = scheduler("save", **PREFILL)
    with caplog.at_level(logging.INFO, logger="foundry"):
        load = scheduler("load", **PREFILL)
    assert load.rt.mode is Mode.LOAD and load.rt.restored == 4 + 2 and fallbacks(load) == []
    # No prefill forward, eager call or capture; the per-shape preparation still ran, in SGLang's order.
    assert events(load.log, "prefill_forward") == [] and events(load.log, "attention") == []
    assert events(load.log, "segment_begin") == [] and "gc.collect" not in load.steps()
    assert events(load.log, "prefill_prepare") == [("prefill_prepare", 32), ("prefill_prepare", 16)]
    # PyTorch makes the capture stream's workspace and the generator's RNG state as at SAVE, first;
    # the runtime keeps the graph that holds the RNG state.
    steps = [e for e in load.log if e == "blas_handle" or (isinstance(e, tuple) and e[0] in ("rng_state", "prefill_prepare"))]
    assert steps[:3] == [("prefill_prepare", 32), "blas_handle", ("rng_state", "generator 0")]
    assert load.rt.graph_rng_state is not None
    # SAVE's blocks, claimed in SAVE's order; what SGLang allocates between them lands where it did at SAVE.
    assert claims_of(load) == recorded_claims(save.rt.adapter.state)
    # SAVE's pauses mirrored with nothing inside: each shape's two warmups, and one flush for its eager
    # calls (flushes with nothing between them are one); the decode loop's 10 as without prefill graphs.
    assert load.dev.count("stop_region") == 10 + 2 * 3 and save.dev.count("stop_region") == 10 + 2 * 4
    runner, saved_runner = load.runner.prefill_cuda_graph_runner, save.runner.prefill_cuda_graph_runner
    assert [t.data_ptr() for t in runner.capture_metadata.values()] == [
        t.data_ptr() for t in saved_runner.capture_metadata.values()]
    assert any("restored 4 decode graphs and 2 prefill graphs" in r.getMessage() for r in caplog.records)

    backend, bcg = runner.backend, sys.modules[BCG]
    archive = backend._foundry_archive
    by_name = {g.name: g for g in archive}
    assert archive is load.rt.archive
    for shape, (key, graph) in zip(SHAPES, backend._graphs.items()):
        assert isinstance(graph, bcg.BreakableCUDAGraph) and len(graph._break_fns) == 2
        assert [s.name for s in graph._segments] == [prefill_patches.segment_name(shape, i, 3) for i in range(3)]
        assert all(isinstance(s, capture_patches.RestoredDecodeGraph) for s in graph._segments)
        assert backend._outputs[key] is archive.outputs(by_name[prefill_patches.segment_name(shape, 2, 3)].index)[0]

    log = sys.modules["sglang"].LOG
    log.clear()
    out = runner.execute(20)  # pads to the 32-token graph, as SGLang does
    segments = [prefill_patches.segment_name(SHAPES[0], i, 3) for i in range(3)]
    assert [e[:2] for e in log] == [("replay", segments[0]), ("attention", 0), ("replay", segments[1]),
                                    ("attention", 1), ("replay", segments[2])]
    for i, call in enumerate(events(log, "attention")):
        restored = archive.outputs(by_name[segments[i]].index)
        assert all(a is b for a, b in zip(call[2:6], restored)) and call[6] is True
        assert call[7] == 20  # the batch SGLang's forward context holds at replay
    assert out is backend._outputs[next(iter(backend._graphs))]  # the restored output
    saved_output = save.runner.prefill_cuda_graph_runner.backend._outputs
    assert out.data_ptr() == next(iter(saved_output.values())).data_ptr() and out.shape == (32, 64)


def test_load_with_prefill_warmups_in_the_region(scheduler, monkeypatch):
    monkeypatch.setenv("FOUNDRY_SGLANG_WARMUP_FORWARDS", "region")
    save = scheduler("save", **PREFILL)
    assert save.dev.count("stop_region") == 2 + 4  # profiling, the kernel warmup, and the 4 eager calls only
    big = save.rt.adapter.state["prefill"]["shapes"][SHAPES[0]]
    # The two warmups' blocks (their eager calls' temporaries too) are the shape's; the captured eager calls ran paused.
    assert len(big["claims"]) == 3 + 2 * (9 + 2) + 9  # after the workspace, RNG state and output buffer
    load = scheduler("load", **PREFILL)
    assert load.rt.restored == 4 + 2 and fallbacks(load) == []
    assert claims_of(load) == recorded_claims(save.rt.adapter.state)
    assert load.dev.count("stop_region") == 2 + 2


def test_an_eager_call_an_archive_cannot_keep_writes_no_archive(scheduler, caplog):
    scheduler.knobs["local_break"] = True
    with caplog.at_level(logging.ERROR, logger="foundry"):
        run = scheduler("save", **PREFILL)
    assert "rms_norm" in run.rt.prefill_problem and "rms_norm" in caplog.text
    assert not run.rt.saved and not scheduler.io.saved  # neither the prefill nor the decode graphs
    decode = run.runner.decode_cuda_graph_runner.backend
    assert len(decode._graphs) == 4  # SGLang captured as without Foundry


@pytest.mark.parametrize("mode", ["auto", "load"])
@pytest.mark.parametrize("knob, why", [
    ("prefill_release_inputs", "after the prefill loop the region's cursor and live bytes are"),  # a free
    ("prefill_session_bytes", "the prefill loop placed memory elsewhere than at SAVE"),  # a block after the claims
    ("metadata_extra", "overlaps the live block"),  # a block where a claim goes
])
def test_load_whose_region_differs_after_the_prefill_loop_lets_sglang_capture(scheduler, mode, knob, why):
    scheduler("save", **PREFILL)
    archive = saved_archive(scheduler)
    scheduler.knobs[knob] = 4096  # SGLang's loop allocates or frees otherwise than at SAVE
    run = scheduler(mode, **PREFILL)
    assert "the prefill graphs cannot be placed" in fallbacks(run)[0] and why in fallbacks(run)[0]
    assert run.rt.mode is (Mode.SAVE if mode == "auto" else Mode.OFF)
    # SGLang captured the prefill graphs after all: forwards, eager calls, real segments; no placeholder left.
    assert events(run.log, "prefill_forward") == [("prefill_forward", 32)] * 3 + [("prefill_forward", 16)] * 3
    graphs = run.runner.prefill_cuda_graph_runner.backend._graphs
    assert len(graphs) == 2 and all(isinstance(g, sys.modules[BCG].BreakableCUDAGraph) for g in graphs.values())
    segment_class = KeepGraph if mode == "auto" else FakeCUDAGraph
    assert all(type(s) is segment_class for g in graphs.values() for s in g._segments)
    # SAVE's blocks may be claimed already: this start writes no archive.
    assert not run.rt.saved and saved_archive(scheduler) is archive
    assert run.runner.decode_cuda_graph_runner.backend._graphs


@pytest.mark.parametrize("mode", ["auto", "load"])
def test_a_decode_restore_failure_after_the_prefill_stand_in_recaptures_the_prefill_graphs(scheduler, mode, caplog):
    scheduler("save", **PREFILL)
    if mode == "auto":
        del saved_archive(scheduler)[NAMES[-1]]  # found before the decode loop
        why = "missing ['size=1"
    else:
        scheduler.knobs["metadata_ptr"] = 0x5100  # found after it
        why = "kv_indptr at 0x5100, at SAVE 0x5000"
    archive = saved_archive(scheduler)
    with caplog.at_level(logging.WARNING, logger="foundry"):
        run = scheduler(mode, **PREFILL)
    assert why in fallbacks(run)[0]
    assert claims_of(run)  # the prefill loop had stood in, placing SAVE's blocks
    # Then SGLang captured the prefill graphs for real (PrefillRestore.recapture).
    assert events(run.log, "prefill_forward") == [("prefill_forward", 32)] * 3 + [("prefill_forward", 16)] * 3
    graphs = run.runner.prefill_cuda_graph_runner.backend._graphs
    assert len(graphs) == 2 and all(isinstance(g, sys.modules[BCG].BreakableCUDAGraph) for g in graphs.values())
    assert all(type(s) is FakeCUDAGraph for g in graphs.values() for s in g._segments)
    assert run.rt.prefill_problem == "the prefill graphs were placed for a restore that fell back"
    assert not run.rt.saved and saved_archive(scheduler) is archive
    assert "no archive is written in this start" in caplog.text
    decode = run.runner.decode_cuda_graph_runner.backend
    assert len(decode._graphs) == 4 and all(type(g) is FakeCUDAGraph for g in decode._graphs.values())


def test_the_prefill_trace_holds_the_cached_segments_after_each_shape_on_both_sides(scheduler, monkeypatch, tmp_path):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("FOUNDRY_SGLANG_PREFILL_TRACE", str(trace))
    scheduler("save", **PREFILL)
    scheduler("load", **PREFILL)
    entries = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [e["label"] for e in entries] == [f"save {s}" for s in SHAPES] + [f"load {s}" for s in SHAPES]
    # The live blocks after each shape: the same on both sides where LOAD placed SAVE's memory.
    assert [e["segments"] for e in entries[:2]] == [e["segments"] for e in entries[2:]]
    assert entries[0]["segments"]


def test_the_trace_diff_names_the_segment_only_one_side_holds(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "prefill_trace_diff.py"
    spec = importlib.util.spec_from_file_location("prefill_trace_diff", script)
    diff = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diff)
    seg = {"address": 0x1000, "size": 2 << 20, "pool": "(0, 0)", "blocks": [[512, "active_allocated"]]}
    lines = [{"label": "save size=32", "segments": [seg]}, {"label": "load size=32", "segments": [seg]},
             {"label": "save size=16", "segments": [seg, dict(seg, address=0x400000)]},
             {"label": "load size=16", "segments": [seg]}]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert diff.main(str(trace)) == 1
    out = capsys.readouterr().out
    assert "after size=16: 1 segments only at SAVE, 0 only at LOAD" in out and "0x400000" in out
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines[:2]))
    assert diff.main(str(trace)) == 0
