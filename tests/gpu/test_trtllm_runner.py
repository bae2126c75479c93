"""trtllm-foundry's restore path through a runner that follows TensorRT-LLM's CUDAGraphRunner
contract (tests/gpu/programs/trtllm_runner_probe.py), driving a small torch model: SAVE in one
process, LOAD in a fresh one that captures nothing, outputs bit-identical. TensorRT-LLM itself is
not imported (it cannot be installed here); the plugin's real capture seams and restore functions are."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

GRAPHS = 6  # BATCH_SIZES in the probe


def test_load_restores_into_the_runner_and_matches_save_bit_for_bit(program, tmp_path):
    saved = program("trtllm_runner_probe", "save", str(tmp_path))
    assert saved["mode"] == "save" and saved["saved"], saved
    assert saved["captures"] == GRAPHS and saved["forwards"] == 2 * GRAPHS  # two warmup forwards per graph
    loaded = program("trtllm_runner_probe", "load", str(tmp_path))
    assert loaded["fallbacks"] == [] and loaded["mode"] == "load", loaded
    assert loaded["restored"] == GRAPHS and loaded["all_restored"] and loaded["graphs"] == GRAPHS
    assert loaded["captures"] == 0 and loaded["forwards"] == 0  # no warmup forward, no capture
    assert loaded["digest"] == saved["digest"]


def test_a_changed_model_falls_back_to_capturing(program, tmp_path, monkeypatch):
    program("trtllm_runner_probe", "save", str(tmp_path))
    monkeypatch.setenv("FOUNDRY_TRTLLM_WARMUP_FORWARDS", "region")  # a graph knob: the archive is stale
    again = program("trtllm_runner_probe", "auto", str(tmp_path))
    assert again["mode"] == "save" and again["captures"] == GRAPHS and again["saved"]
    assert "warmup_forwards" in again["fallbacks"][0], again["fallbacks"]
