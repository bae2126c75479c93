"""Graph SAVE in one process, LOAD in a fresh one: bit-identical outputs on fresh inputs."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu

CASES = ["elementwise", "gemm_bf16", "gemm_fp16", "decode_gemm", "decode_gemm_paused", "decode_linear", "compile",
         "streams", "pdl"]


@pytest.mark.parametrize("case", CASES)
def test_restored_graph_is_bit_identical(case, program, tmp_path):
    env = dict(os.environ, FOUNDRY_TEST_TMP=str(tmp_path))
    saved = program("graph_probe", "save", case, str(tmp_path), env=env)
    assert "error" not in saved, saved
    loaded = program("graph_probe", "load", case, str(tmp_path), env=env)
    print(f"\n{case}: capture {saved['capture_s']:.3f} s, load {loaded['load_s']:.3f} s, "
          f"{len(saved['kernels'])} kernels, edges [from, to, type, from_port, to_port] {saved['edges']}")
    assert loaded["digest"] == saved["digest"]
    # Edges, with their CUgraphEdgeData (type and ports), read back identical.
    assert loaded["edges"] == saved["edges"]
    # Every kernel launches as captured: grid, block, shared memory, priority, cluster shape.
    assert sorted(map(json.dumps, loaded["launches"])) == sorted(map(json.dumps, saved["launches"]))
    print(f"{case}: kernel priorities {sorted({k['priority'] for k in saved['launches']})}, "
          f"exec flags captured {saved['exec_flags']} restored {loaded['exec_flags']}")
    if case == "streams":  # the side stream's kernels were captured at its higher priority
        assert {k["priority"] for k in saved["launches"]} == {-1, 0}, saved["launches"]
    # The restored exec is instantiated as PyTorch instantiates a captured one (the driver reports
    # AUTO_FREE_ON_LAUNCH, 1, for both; it does not report USE_NODE_PRIORITY, which both pass).
    assert loaded["exec_flags"] & 1, loaded["exec_flags"]
    if saved["exec_flags"] is not None:
        assert loaded["exec_flags"] == saved["exec_flags"], (loaded["exec_flags"], saved["exec_flags"])
    if case.startswith(("gemm", "decode")):
        assert any("nvjet" in k for k in saved["kernels"]), saved["kernels"]
    if case == "gemm_bf16":
        assert any("splitKreduce" in k for k in saved["kernels"]), saved["kernels"]
    if case == "compile":
        assert any(k.startswith("triton") for k in saved["kernels"]), saved["kernels"]
    if case == "pdl":
        assert any(e[2] == 1 for e in saved["edges"]), "no programmatic edge was captured"


def test_graph_with_a_host_node_is_refused(program, tmp_path):
    r = program("graph_probe", "host", str(tmp_path), env=dict(os.environ, FOUNDRY_TEST_TMP=str(tmp_path)))
    assert r["error"] == "UnsupportedError", r
    assert "node 0 is a host node" in r["message"] and "graph 0 (host)" in r["message"], r["message"]
    assert not (tmp_path / "host").exists(), "a refused SAVE must leave no archive"


def test_memory_outside_the_region_is_refused_in_strict_mode(program, tmp_path):
    env = dict(os.environ, FOUNDRY_STRICT="1", FOUNDRY_TEST_TMP=str(tmp_path))
    r = program("graph_probe", "save", "foreign", str(tmp_path), env=env)
    assert r.get("error") == "AuditError", r
    assert "outside the allocation region" in r["message"] and "parameter offset" in r["message"], r["message"]


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    from conftest import run_program

    d = tmp_path_factory.mktemp("batches")
    saved = run_program("batch_probe", "save", str(d / "archive"), "64")
    return d / "archive", saved


@pytest.mark.parametrize("mode", ["eager", "parallel", "lazy", "background"])
def test_64_batch_sizes_share_templates_and_restore_identically(batches, mode, program):
    archive, saved = batches
    loaded = program("batch_probe", "load", str(archive), "64", mode)
    print(f"\n64 sizes [{mode}]: capture+warmup {saved['capture_s']:.2f} s, graphs {saved['graphs']}, "
          f"groups {saved['groups']}, nodes {saved['nodes']}, archive {saved['archive_bytes'] / 2**20:.1f} MiB, "
          f"ready {loaded['ready_s']:.3f} s, first replay {loaded['first_replay_s']:.3f} s, phases {loaded['times']}")
    assert saved["graphs"] == 64
    assert saved["groups"] < saved["graphs"]
    assert loaded["groups"] == saved["groups"]
    assert loaded["digests"] == saved["digests"]


def test_deferred_graphs_are_instantiated_at_their_first_use_and_restore_identically(batches, program):
    archive, saved = batches
    loaded = program("batch_probe", "load", str(archive), "64", "deferred")
    ready = loaded["ready_after_load"]
    assert [b for b in range(1, 65) if ready[f"bs{b}"]] == list(range(2, 65, 2)), "only the even sizes at LOAD"
    assert loaded["instantiated"] == {"bs2": True, "bs3": True, "bs5": False}  # instantiate(): bs3 now, bs5 not yet
    assert loaded["digests"] == saved["digests"]  # the deferred ones instantiated at their replay


@pytest.mark.alone  # compares the device's free memory: another test's process on the GPU would move it
def test_exec_memory_grown_ahead_is_what_the_restore_then_uses(batches, program):
    """The warm-up's stand-ins leave the driver holding device memory, and the restore's execs take
    that memory instead of new memory: the premise of growing it on a thread during an engine's
    weight loading (foundry_core.exec_memory)."""
    archive, saved = batches
    plain = program("batch_probe", "load", str(archive), "64", "eager")
    warmed = program("batch_probe", "load", str(archive), "64", "eager", "warm")
    held = warmed["free"]["start"] - warmed["free"]["warmed"]  # kept by the driver after the stand-ins
    restore_plain = plain["free"]["warmed"] - plain["free"]["restored"]
    restore_warmed = warmed["free"]["warmed"] - warmed["free"]["restored"]
    mib = 2 ** 20
    print(f"\nwarm-up: {warmed['warm']}, driver holds {held / mib:.1f} MiB after it; the restore took "
          f"{restore_plain / mib:.1f} MiB without it, {restore_warmed / mib:.1f} MiB with it; instantiate "
          f"{plain['times']['instantiate_s']:.3f} s without, {warmed['times']['instantiate_s']:.3f} s with")
    assert warmed["warm"]["execs"] == saved["graphs"] and warmed["warm"]["nodes"] == saved["nodes"]
    assert plain["warm"] is None
    assert held > 0, "the driver gave the stand-ins' memory back: nothing was grown ahead"
    assert restore_plain - restore_warmed >= held // 2, "the restore did not use the memory grown ahead"
    assert warmed["digests"] == saved["digests"]


def test_child_graph_nodes_restore(program, tmp_path):
    env = dict(os.environ, FOUNDRY_TEST_TMP=str(tmp_path))
    assert program("graph_probe", "child", "save", str(tmp_path), env=env)["saved"]
    r = program("graph_probe", "child", "load", str(tmp_path), env=env)
    assert r["same_memory"] and r["same_object"] and r["max_error"] < 1e-5, r


def test_single_graph_saves_regroup_and_restore_through_start_graph_builds(program, tmp_path):
    saved = program("graph_probe", "many", "save", str(tmp_path))
    loaded = program("graph_probe", "many", "load", str(tmp_path))
    assert saved["groups"] < 8
    assert loaded["first_is_bs64"]
    assert loaded["digests"] == saved["digests"]
