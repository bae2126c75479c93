"""vLLM's shared workspace allocated again in the region at the start of the capture phase
(vllm_foundry/workspace.py, capture_patches.rehome_workspace), without vLLM or a GPU."""

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

from vllm_foundry import capture_patches, workspace  # noqa: E402


class Buffer:
    """What the manager's slots hold: numel and element_size, like a torch uint8 tensor."""

    def __init__(self, size: int, device: str = "cuda:0"):
        self.size, self.device = size, device

    def numel(self) -> int:
        return self.size

    def element_size(self) -> int:
        return 1


def manager(*slots: Buffer | None) -> types.SimpleNamespace:
    return types.SimpleNamespace(_device="cuda:0", _current_workspaces=list(slots))


def test_sizes_are_the_bytes_each_slot_holds():
    assert workspace.sizes(manager(None, Buffer(4096))) == [0, 4096]
    assert workspace.sizes(types.SimpleNamespace()) == []  # a manager without slots


def test_rehome_allocates_each_used_slot_again_after_letting_go_of_the_old_one():
    old = Buffer(4096)
    m = manager(old, None)
    calls = []

    def allocate(size, device):
        calls.append((size, device, m._current_workspaces[0]))
        return Buffer(size, device)

    assert workspace.rehome(m, [4096, 0], allocate) == 4096
    assert [(s, d) for s, d, _ in calls] == [(4096, "cuda:0")]
    assert calls[0][2] is None, "the old buffer was still held when the new one was asked for"
    assert m._current_workspaces[0] is not old and m._current_workspaces[0].size == 4096
    assert m._current_workspaces[1] is None


def test_rehome_at_recorded_sizes_fills_an_unused_manager_and_ignores_extra_sizes():
    m = manager(None)
    assert workspace.rehome(m, [512, 1024], lambda size, device: Buffer(size, device)) == 512
    assert workspace.sizes(m) == [512]


@pytest.mark.parametrize("state, sizes", [
    ({}, []),
    ({"workspace": [0, 2048]}, [0, 2048]),
    ({"workspace": "2048"}, []),
    ({"workspace": [-1]}, []),
])
def test_recorded_sizes(state, sizes):
    assert workspace.recorded_sizes(state) == sizes


def test_no_manager_without_vllm_or_before_vllm_made_one():
    assert workspace.current_manager() is None  # no vLLM here, or vLLM's manager not initialised


def _runtime(mode: Mode, recorded: dict | None = None) -> types.SimpleNamespace:
    return types.SimpleNamespace(mode=mode, adapter=types.SimpleNamespace(state={}),
                                 recorded_adapter_state=lambda: recorded or {})


@pytest.fixture
def live_manager(monkeypatch):
    m = manager(Buffer(8192, "paused-pool"))
    monkeypatch.setattr(workspace, "current_manager", lambda: m)
    monkeypatch.setattr(workspace, "torch_bytes", lambda size, device: Buffer(size, "region"))
    return m


def test_save_allocates_the_grown_workspace_in_the_region_and_records_its_size(live_manager):
    rt = _runtime(Mode.SAVE)
    capture_patches.rehome_workspace(rt)
    assert rt.adapter.state["workspace"] == [8192]
    assert live_manager._current_workspaces[0].device == "region"


def test_load_allocates_the_recorded_size_and_records_it_for_a_later_save(live_manager):
    live_manager._current_workspaces[0] = None  # LOAD skipped the forwards that grow it
    rt = _runtime(Mode.LOAD, {"workspace": [8192]})
    capture_patches.rehome_workspace(rt)
    assert workspace.sizes(live_manager) == [8192]
    assert live_manager._current_workspaces[0].device == "region"
    assert rt.adapter.state["workspace"] == [8192]


def test_load_of_an_archive_without_sizes_allocates_nothing(live_manager):
    live_manager._current_workspaces[0] = None
    capture_patches.rehome_workspace(_runtime(Mode.LOAD, {}))
    assert live_manager._current_workspaces == [None]


def test_off_and_a_vllm_without_a_manager_change_nothing(live_manager, monkeypatch):
    rt = _runtime(Mode.OFF)
    capture_patches.rehome_workspace(rt)
    assert live_manager._current_workspaces[0].device == "paused-pool" and rt.adapter.state == {}
    monkeypatch.setattr(workspace, "current_manager", lambda: None)
    rt = _runtime(Mode.SAVE)
    capture_patches.rehome_workspace(rt)
    assert rt.adapter.state == {}
