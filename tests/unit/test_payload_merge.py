"""save_graph_manifest's native half: graphs saved one by one regrouped into shared templates."""

from __future__ import annotations

import copy
import ctypes
import os

import pytest

from foundry_core import _native
from foundry_core.errors import MismatchError
from foundry_core.inspect import payload_dump
from test_inspect_verify_diff import payload_doc, write_payload


def single(doc: dict, index: int) -> dict:
    """A payload holding only member `index` of `doc`, as CUDAGraph.save writes one graph."""
    m = doc["members"][index]
    out = copy.deepcopy(doc)
    out["templates"] = [doc["templates"][m["template"]]]
    out["members"] = [{**m, "template": 0}]
    return out


def merge(tmp_path, docs: list[dict]) -> tuple[int, dict]:
    paths = []
    for i, d in enumerate(docs):
        p = tmp_path / f"g{i}.fgr"
        write_payload(p, d)
        paths.append(os.fsencode(p))
    out = tmp_path / "merged.fgr"
    templates = ctypes.c_uint32()
    arr = (ctypes.c_char_p * len(paths))(*paths)
    _native.call("foundry_payload_merge", arr, len(paths), os.fsencode(out), ctypes.byref(templates))
    return templates.value, payload_dump(out)


def test_single_graphs_of_one_topology_share_a_template(tmp_path):
    doc = payload_doc()
    templates, merged = merge(tmp_path, [single(doc, 0), single(doc, 1), single(doc, 2)])
    assert templates == 2  # bs=1 and bs=2 regroup; prefill stays alone
    assert [m["name"] for m in merged["members"]] == ["bs=1", "bs=2", "prefill"]
    assert merged["members"][0]["template"] == merged["members"][1]["template"]
    # bs=2 keeps exactly its differences against the shared template: node 2's grid, and its event
    # (graphs saved separately have their own events; event indices are updatable).
    delta = merged["members"][1]["delta"]
    assert [d["node"] for d in delta] == [2, 3]
    assert delta[0]["value"]["kernel"]["grid"] == [16, 1, 1] and delta[1]["value"]["event"] == 1


def test_event_count_is_the_sum_of_the_saves(tmp_path):
    doc = payload_doc()
    _, merged = merge(tmp_path, [single(doc, 0), single(doc, 1)])
    assert merged["event_count"] == 2


def test_graphs_from_another_region_are_refused(tmp_path):
    doc = payload_doc()
    other = single(doc, 1)
    other["region"]["base"] += 1 << 30
    with pytest.raises(MismatchError, match="another allocation region"):
        merge(tmp_path, [single(doc, 0), other])


def test_merged_payload_keeps_the_kernels_cache_preferences(tmp_path):
    from test_inspect_verify_diff import GEMM, with_gemm_preferring_shared

    doc = with_gemm_preferring_shared(payload_doc())
    _, merged = merge(tmp_path, [single(doc, 0), single(doc, 1), single(doc, 2)])
    kernels = [n["kernel"] for t in merged["templates"] for n in t["nodes"] if n["kind"] == "kernel"]
    assert {k["name"]: k["func"]["cache_config"] for k in kernels}[GEMM] == 1
    assert all(k["func"]["cache_config"] == 0 for k in kernels if k["name"] != GEMM)
