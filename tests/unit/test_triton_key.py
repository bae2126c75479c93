"""foundry_core.engine.triton_key: Triton's cache key computed once, on a thread, only when
Triton is already imported; and SGLang's LOAD starts it."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from foundry_core.engine import triton_key


@pytest.fixture
def fake_triton(monkeypatch):
    """An imported ``triton.runtime.cache`` whose ``triton_key`` records the thread it ran on."""
    calls: list[str] = []
    module = types.ModuleType("triton.runtime.cache")
    module.triton_key = lambda: calls.append(threading.current_thread().name) or "3.6-abc"
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", module)
    triton_key.reset()
    yield calls
    triton_key.reset()


def test_nothing_starts_before_triton_is_imported(monkeypatch):
    for name in triton_key.MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    triton_key.reset()
    assert triton_key.warm_triton_key() is None


def test_the_key_is_computed_once_on_a_daemon_thread(fake_triton):
    thread = triton_key.warm_triton_key()
    assert thread is not None and thread.daemon
    thread.join(5)
    assert fake_triton == ["foundry-triton-key"]
    assert triton_key.warm_triton_key() is None  # once per process
    assert fake_triton == ["foundry-triton-key"]


def test_older_triton_layout_is_found(monkeypatch):
    calls: list[int] = []
    module = types.ModuleType("triton.compiler.compiler")
    module.triton_key = lambda: calls.append(1)
    monkeypatch.delitem(sys.modules, "triton.runtime.cache", raising=False)
    monkeypatch.setitem(sys.modules, "triton.compiler.compiler", module)
    triton_key.reset()
    try:
        triton_key.warm_triton_key().join(5)
    finally:
        triton_key.reset()
    assert calls == [1]


def test_a_failing_key_is_left_to_triton(monkeypatch, caplog):
    module = types.ModuleType("triton.runtime.cache")

    def broken():
        raise OSError("libtriton.so: no such file")

    module.triton_key = broken
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", module)
    triton_key.reset()
    with caplog.at_level("DEBUG", logger="foundry"):
        triton_key.warm_triton_key().join(5)
    triton_key.reset()
    assert "could not be computed ahead: libtriton.so" in caplog.text
