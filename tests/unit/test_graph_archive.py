"""GraphArchive without a GPU (the native graph set replaced): which graphs are instantiated when,
and output tensors made at their first ask."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from foundry_core import _native, graphs

NAMES = ["bs1", "bs2", "pw:backbone:0/2:bs1", "pw:backbone:1/2:bs1"]


@pytest.fixture
def native(monkeypatch):
    """The native calls the archive made: (name, args after the handle)."""
    calls: list[tuple] = []

    def call(name, handle, *args):
        if name == "foundry_graphset_info":
            if args[0] is not None:
                args[0]._obj.value, args[1]._obj.value = len(NAMES), 2
            return
        if name == "foundry_graphset_name":
            args[1].value = NAMES[args[0]].encode()
            return
        calls.append((name, *args))

    monkeypatch.setattr(_native, "call", call)
    return calls


@pytest.fixture
def archive(native, monkeypatch):
    made: list[dict] = []

    def rebuild(description, owner):
        made.append(description)
        return ("tensor", description["tensors"][0]["ptr"])

    monkeypatch.setattr(graphs, "rebuild_outputs", rebuild)
    manifest = {"graphs": [{"name": n, "outputs": {"kind": "tensor", "tensors": [{"ptr": 0x1000 * (i + 1)}]}}
                           for i, n in enumerate(NAMES)]}
    a = graphs.GraphArchive(Path("manifest.json"), manifest, ctypes.c_void_p(), graphs.LoadTimes())
    a.made = made
    return a


def test_deferred_graphs_are_left_for_their_first_use(archive, native):
    archive.instantiate_all(threads=4, defer=lambda name: name.startswith("pw:"))
    assert native == [("foundry_graphset_instantiate", 0), ("foundry_graphset_instantiate", 1)]  # on this thread
    archive.get("pw:backbone:1/2:bs1").instantiate()
    assert native[-1] == ("foundry_graphset_instantiate", 3)


def test_without_defer_every_graph_is_instantiated(archive, native):
    archive.instantiate_all(threads=1)
    assert native == [("foundry_graphset_instantiate", i) for i in range(len(NAMES))]
    native.clear()
    archive.instantiate_all(threads=4)
    assert native == [("foundry_graphset_instantiate_all", 4)]


def test_output_tensors_are_made_at_the_first_ask_once(archive):
    assert archive.made == [] and archive.times.outputs_s == 0.0
    first = archive.outputs(2)
    assert first == ("tensor", 0x3000) and len(archive.made) == 1
    assert archive.outputs(2) is first and len(archive.made) == 1
    archive.outputs(0)
    assert [d["tensors"][0]["ptr"] for d in archive.made] == [0x3000, 0x1000]
    assert archive.times.outputs_s > 0.0
