"""vLLM's shared workspace allocated again in the region after the memory profile
(vllm_foundry/workspace.py), without vLLM or a GPU. The worker flow that calls it is tested in
test_vllm_plugin.py (test_*_workspace_*)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "vllm_foundry"
try:
    import vllm_foundry  # noqa: F401
except ImportError:
    sys.path.insert(0, str(PLUGIN_DIR))

from foundry_core.engine import Mode  # noqa: E402

from vllm_foundry import workspace  # noqa: E402

REGION = range(0x7000_0000_0000, 0x7100_0000_0000)


class Buffer:
    """What the manager's slots hold: numel, element_size and data_ptr, like a torch uint8 tensor."""

    next_address = REGION.start

    def __init__(self, size: int, address: int | None = None):
        self.size = size
        if address is None:
            address, Buffer.next_address = Buffer.next_address, Buffer.next_address + size
        self.address = address

    def numel(self) -> int:
        return self.size

    def element_size(self) -> int:
        return 1

    def data_ptr(self) -> int:
        return self.address


def outside(size: int) -> Buffer:
    return Buffer(size, address=0x7F00_0000_0000)


def manager(*slots: Buffer | None) -> types.SimpleNamespace:
    return types.SimpleNamespace(_device="cuda:0", _current_workspaces=list(slots))


def in_region(address: int) -> bool:
    return address in REGION


def test_sizes_to_place_skip_unused_slots_and_slots_already_in_the_region():
    assert workspace.sizes_to_place(manager(None, outside(4096), Buffer(512)), in_region) == [0, 4096, 0]
    assert workspace.sizes_to_place(types.SimpleNamespace(), in_region) == []  # a manager without slots


def test_rehome_allocates_before_letting_go_of_the_old_buffer():
    old = outside(4096)
    m = manager(old, None, outside(64))
    calls = []

    def allocate(size, device):
        calls.append((size, device, m._current_workspaces[0] is old))
        return Buffer(size)

    assert workspace.rehome(m, [4096, 0, 0], allocate) == 4096
    assert calls == [(4096, "cuda:0", True)], "the old buffer must stay until the new one exists"
    assert in_region(m._current_workspaces[0].data_ptr()) and m._current_workspaces[0].size == 4096
    assert m._current_workspaces[1] is None and not in_region(m._current_workspaces[2].data_ptr())


def test_rehome_at_recorded_sizes_fills_unused_slots_in_order_and_ignores_extra_sizes():
    m = manager(None, None)
    order = []
    assert workspace.rehome(m, [512, 1024, 2048], lambda size, device: order.append(size) or Buffer(size)) == 1536
    assert order == [512, 1024]
    assert [b.size for b in m._current_workspaces] == [512, 1024]


@pytest.mark.parametrize("state, sizes", [
    ({}, []),
    ({"workspace": [0, 2048]}, [0, 2048]),
    ({"workspace": "2048"}, []),
    ({"workspace": [-1]}, []),
    ({"workspace": [1.5]}, []),
])
def test_recorded_sizes(state, sizes, caplog):
    assert workspace.recorded_sizes(state) == sizes
    malformed = "workspace" in state and state["workspace"] != sizes
    assert ("not a list of byte counts" in caplog.text) == malformed


def test_no_manager_where_vllm_has_none():
    assert workspace.current_manager() is None  # no vLLM in this environment


def _runtime(mode: Mode, recorded: dict | None = None, region_open: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(mode=mode, region_open=region_open, adapter=types.SimpleNamespace(state={}),
                                 recorded_adapter_state=lambda: recorded or {})


@pytest.fixture
def live_manager(monkeypatch):
    m = manager(outside(8192), None)
    monkeypatch.setattr(workspace, "current_manager", lambda: m)
    monkeypatch.setattr(workspace, "torch_bytes", lambda size, device: Buffer(size))
    monkeypatch.setattr(workspace, "in_region", in_region)
    return m


def test_save_places_the_grown_workspace_in_the_region_and_records_its_sizes(live_manager):
    rt = _runtime(Mode.SAVE)
    workspace.place_in_region(rt)
    assert rt.adapter.state["workspace"] == [8192, 0]
    assert in_region(live_manager._current_workspaces[0].data_ptr())


def test_load_allocates_the_recorded_sizes_and_records_them_for_a_later_save(live_manager):
    live_manager._current_workspaces[0] = None  # LOAD skipped the profile that grows it
    rt = _runtime(Mode.LOAD, {"workspace": [8192, 0]})
    workspace.place_in_region(rt)
    assert [None if b is None else b.size for b in live_manager._current_workspaces] == [8192, None]
    assert rt.adapter.state["workspace"] == [8192, 0]


def test_load_of_an_archive_without_sizes_allocates_nothing(live_manager):
    live_manager._current_workspaces[0] = None
    workspace.place_in_region(_runtime(Mode.LOAD, {}))
    assert live_manager._current_workspaces == [None, None]


@pytest.mark.parametrize("rt", [_runtime(Mode.OFF), _runtime(Mode.SAVE, region_open=False)])
def test_off_or_without_a_region_nothing_changes(live_manager, rt):
    before = list(live_manager._current_workspaces)
    workspace.place_in_region(rt)
    assert live_manager._current_workspaces == before and rt.adapter.state == {}


def test_a_vllm_without_a_manager_changes_nothing(monkeypatch):
    monkeypatch.setattr(workspace, "current_manager", lambda: None)
    rt = _runtime(Mode.SAVE)
    workspace.place_in_region(rt)
    assert rt.adapter.state == {}
