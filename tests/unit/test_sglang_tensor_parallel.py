"""sglang-foundry with tensor parallel (FOUNDRY_SGLANG_TENSOR_PARALLEL=1), over the fake SGLang:
what is refused, NCCL's all-reduce forced, and the four LOAD agreements every rank answers once
(ranks.py). One process plays rank 0; its peer's answers are scripted."""

from __future__ import annotations

import shutil

import pytest

from foundry_core.engine import Mode
from foundry_core.engine.layout import rank_dir
from foundry_core.errors import FormatError

from sglang_foundry import capture_patches, modes, ranks
from test_sglang_plugin import (  # noqa: F401 - its fixtures
    KeepGraph,
    _server_args,
    clean_state,
    fake_sglang,
    fake_torch,
    scheduler,
)

TP = {"FOUNDRY_SGLANG_TENSOR_PARALLEL": "1"}


# ---- what is refused ---------------------------------------------------------------------------


def test_tensor_parallel_needs_its_switch(fake_sglang):
    sa = _server_args(fake_sglang, tp_size=2)
    (problem,) = modes.unsupported_settings(sa, environ={})
    assert problem.startswith("tp_size=2 is not supported (FOUNDRY_SGLANG_TENSOR_PARALLEL=1 saves and restores it")
    assert modes.unsupported_settings(sa, environ=TP) == []


@pytest.mark.parametrize("field, value, words", [
    ("enable_quant_communications", True, "--enable-quant-communications"),
    ("enable_fused_moe_sum_all_reduce", True, "--enable-fused-moe-sum-all-reduce"),
    ("flashinfer_allreduce_fusion_backend", "trtllm", "pass --enforce-disable-flashinfer-allreduce-fusion"),
    ("enable_symm_mem", True, "--enable-symm-mem"),
    ("enable_mscclpp", True, "--enable-mscclpp"),
])
def test_with_tensor_parallel_only_nccls_all_reduce_is_supported(fake_sglang, field, value, words):
    sa = _server_args(fake_sglang, tp_size=2)
    setattr(sa, field, value)
    (problem,) = modes.unsupported_settings(sa, environ=TP)
    assert words in problem


@pytest.mark.parametrize("field", ["pp_size", "dp_size", "ep_size", "nnodes"])
def test_other_parallel_layouts_stay_refused_with_the_switch(fake_sglang, field):
    sa = _server_args(fake_sglang, tp_size=2)
    setattr(sa, field, 2)
    (problem,) = modes.unsupported_settings(sa, environ=TP)
    assert problem.startswith(f"{field}=2 is not supported (one GPU, or tensor parallel on one node")


def test_one_gpu_checks_no_all_reduce_setting(fake_sglang):
    sa = _server_args(fake_sglang)
    sa.flashinfer_allreduce_fusion_backend = "trtllm"  # a 1-GPU start runs no all-reduce
    assert modes.unsupported_settings(sa, environ={}) == []


# ---- a tensor-parallel start: NCCL only, agreements ----------------------------------------------


class Peer:
    """Rank 1 of the start, as rank 0's agreements see it: answers yes except at the points listed.
    Each agreement also goes into the fake SGLang's log, beside its barriers."""

    def __init__(self, refuses: tuple[int, ...] = ()):
        self.refuses = refuses
        self.asked: list[bool] = []  # rank 0's answers, in order

    def __call__(self, rt, ok: bool) -> bool:
        import sglang

        self.asked.append(ok)
        sglang.LOG.append("agreement")
        return ok and len(self.asked) - 1 not in self.refuses


def collectives(run) -> list[str]:
    """What rank 0 met its peer at, in order (agreements, and SGLang's barriers in the decode loop)."""
    return [e for e in run.log if e in ("agreement", "tp_barrier")]


@pytest.fixture
def two_ranks(scheduler, monkeypatch):
    """``scheduler`` with tensor parallel 2 on, rank 0 in this process; ``saved()`` writes a SAVE
    archive and gives rank 1 a copy of rank 0's (what the session checks of a peer)."""
    for name, value in TP.items():
        monkeypatch.setenv(name, value)

    def start(mode: str, peer: Peer, **fields):
        monkeypatch.setattr(ranks, "all_ranks", peer)
        return scheduler(mode, tp_size=2, **fields)

    def saved(**fields):
        run = start("save", Peer(), **fields)
        shutil.copytree(rank_dir(scheduler.archive, 0), rank_dir(scheduler.archive, 1))
        return run

    start.saved = saved  # type: ignore[attr-defined]
    start.scheduler = scheduler  # type: ignore[attr-defined]
    return start


def test_a_tensor_parallel_start_all_reduces_through_nccl(two_ranks, fake_sglang):
    run = two_ranks.saved()
    assert ("custom_all_reduce", False) in run.log
    assert run.log.index(("custom_all_reduce", False)) < run.log.index("groups")  # before the groups are made
    gatherer = fake_sglang["sglang.srt.distributed.device_communicators.triton_symm_mem_ag"].MultimemAllGatherer()
    assert gatherer._build(object()) is None  # NCCL's all-gather for the logits


def test_one_gpu_keeps_sglangs_all_reduce(scheduler):
    run = scheduler("save")
    assert not [e for e in run.log if isinstance(e, tuple) and e[0] == "custom_all_reduce"]


@pytest.mark.parametrize("prefill", [False, True])
def test_every_rank_answers_each_agreement_once_and_all_restore(two_ranks, prefill):
    fields = {"disable_prefill_cuda_graph": not prefill}
    two_ranks.saved(**fields)
    peer = Peer()
    run = two_ranks("load", peer, **fields)
    assert run.rt.mode is Mode.LOAD and run.rt.restored == (4 + 2 if prefill else 4)  # the fake's 2 prefill shapes
    # The KV pool, the capture phase, (the prefill loop,) the decode loop's start and end.
    assert peer.asked == [True] * (5 if prefill else 4)
    points = 4 if prefill else 3
    assert collectives(run) == ["agreement"] * points + ["tp_barrier"] * 8 + ["agreement"]
    assert "profile" not in run.steps() and run.events("forward") == []


@pytest.mark.parametrize("point, words", [
    (0, "another rank does not LOAD (at the KV pool)"),
    (1, "another rank does not LOAD (at the capture phase)"),
    (2, "another rank could not load its archive"),
    (3, "another rank could not restore its graphs"),
])
def test_a_peer_that_cannot_load_makes_this_rank_capture_too(two_ranks, point, words):
    two_ranks.saved()
    peer = Peer(refuses=(point,))
    run = two_ranks("load", peer)
    assert run.rt.mode is Mode.OFF and words in run.rt.adapter.fallback_reasons[0]
    # This rank captured with its forwards (whose collectives its peer joins), never restored.
    assert len(run.events("forward")) == 12 and run.rt.restored == 0
    assert all(type(g) is not capture_patches.RestoredDecodeGraph
               for g in run.runner.decode_cuda_graph_runner.backend._graphs.values())
    if point == 0:
        assert "profile" in run.steps()  # with SGLang's free-memory all-reduce, as its peer
    # The first two points are answered by every rank that may LOAD, the later ones by every rank
    # still loading, which after the second is every rank or none: each once.
    assert peer.asked == {0: [True, False], 1: [True, True], 2: [True] * 3, 3: [True] * 4}[point]


def test_a_peer_that_cannot_place_its_prefill_graphs_makes_both_capture_them(two_ranks):
    fields = {"disable_prefill_cuda_graph": False}
    two_ranks.saved(**fields)
    peer = Peer(refuses=(2,))  # the third point: the end of the prefill loop
    run = two_ranks("load", peer, **fields)
    assert "another rank could not place its prefill graphs" in run.rt.adapter.fallback_reasons[0]
    assert run.events("prefill_forward") and len(run.events("forward")) == 12
    assert peer.asked == [True, True, True]  # the decode restore is not reached


def test_a_rank_whose_archive_failed_still_answers_no_at_the_kv_pool(two_ranks):
    two_ranks.saved()
    (rank_dir(two_ranks.scheduler.archive, 0) / "engine_state.json").unlink()
    peer = Peer()
    run = two_ranks("load", peer)
    assert run.rt.mode is Mode.OFF
    assert peer.asked == [False, False]  # it fell back at its start, and still answered both points
    assert "profile" in run.steps() and len(run.events("forward")) == 12


def test_a_rank_whose_graphs_fail_to_load_answers_before_the_decode_loop(two_ranks, monkeypatch):
    """Its peer, restoring, runs SGLang's decode loop with a barrier per shape: this rank says no
    before that loop, so both capture, meeting at the same barriers."""
    import foundry_core.graphs

    two_ranks.saved()

    def corrupt(*_args, **_kwargs):
        raise FormatError("graphs.fgr: section 156 (type 3): checksum mismatch; the file is corrupt")

    monkeypatch.setattr(foundry_core.graphs, "load_graphs", corrupt)
    peer = Peer()
    run = two_ranks("load", peer)
    assert run.rt.mode is Mode.OFF and peer.asked == [True, True, False]
    assert collectives(run)[:4] == ["agreement"] * 3 + ["tp_barrier"]  # no answer left for after the loop
    assert collectives(run).count("agreement") == 3 and len(run.events("forward")) == 12


def test_an_agreement_left_by_an_error_answers_no_once(monkeypatch):
    asked: list[bool] = []
    monkeypatch.setattr(ranks, "all_ranks", lambda rt, ok: asked.append(ok) or ok)
    with pytest.raises(RuntimeError):
        with ranks.Agreement(object()):
            raise RuntimeError("a CUDA error before the answer")
    assert asked == [False]
    with ranks.Agreement(object()) as agreement:
        assert agreement.answer(True) is True and agreement.answer(False) is True  # the first answer stands
    assert asked == [False, True]


def test_a_collective_that_raised_is_not_asked_again_on_the_way_out(monkeypatch):
    calls: list[bool] = []

    def broken(rt, ok):
        calls.append(ok)
        raise RuntimeError("gloo: connection reset by peer")

    monkeypatch.setattr(ranks, "all_ranks", broken)
    with pytest.raises(RuntimeError, match="connection reset"):
        with ranks.Agreement(object()) as agreement:
            agreement.answer(True)
    assert calls == [True]
