"""sglang_foundry.compile_stats: what torch.compile did in a start, read from PyTorch's counters."""

from __future__ import annotations

import logging
import sys
import types
from collections import Counter

from sglang_foundry import compile_stats


def _counters(**groups: dict[str, int]) -> dict[str, Counter]:
    return {group: Counter(values) for group, values in groups.items()}


def test_cache_and_graph_counters_are_kept_and_the_rest_left_out():
    counters = _counters(stats={"unique_graphs": 12, "calls_captured": 340, "frames": 7},
                         inductor={"fxgraph_cache_hit": 10, "fxgraph_cache_miss": 2, "pattern_matcher_count": 99},
                         aot_autograd={"autograd_cache_hit": 10, "total": 12}, graph_break={"x": 3})
    found = compile_stats.compile_counters(counters)
    assert found == {"stats.calls_captured": 340, "stats.unique_graphs": 12, "inductor.fxgraph_cache_hit": 10,
                     "inductor.fxgraph_cache_miss": 2, "aot_autograd.autograd_cache_hit": 10}
    line = compile_stats.describe(found)
    assert "inductor.fxgraph_cache_miss 2" in line and "pattern_matcher" not in line


def test_a_start_that_compiled_nothing_says_so():
    assert compile_stats.compile_counters(_counters(inductor={"fxgraph_cache_hit": 0})) == {}
    assert compile_stats.describe({}) == "nothing traced or compiled"


def test_logged_only_for_compiled_starts(monkeypatch, caplog):
    utils = types.ModuleType("torch._dynamo.utils")
    utils.counters = _counters(inductor={"fxgraph_cache_miss": 3})
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", utils)
    with caplog.at_level(logging.INFO, logger="foundry.sglang"):
        compile_stats.log_compile_stats(types.SimpleNamespace(enable_torch_compile=False), "the capture phase")
        assert not caplog.records
        compile_stats.log_compile_stats(types.SimpleNamespace(enable_torch_compile=True), "the capture phase")
    assert [r.getMessage() for r in caplog.records] == [
        "foundry: torch.compile after the capture phase: inductor.fxgraph_cache_miss 3"]


def test_no_dynamo_module_means_nothing_compiled(monkeypatch, caplog):
    monkeypatch.delitem(sys.modules, "torch._dynamo.utils", raising=False)
    with caplog.at_level(logging.INFO, logger="foundry.sglang"):
        compile_stats.log_compile_stats(types.SimpleNamespace(enable_torch_compile=True), "the capture phase")
    assert caplog.records[0].getMessage() == "foundry: torch.compile after the capture phase: nothing traced or compiled"
