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


def test_waiting_without_a_thread_returns_at_once(fake_triton):
    assert triton_key.wait_triton_key() == 0.0
    assert fake_triton == []


def test_waiting_joins_a_thread_still_hashing(monkeypatch, caplog):
    """The first launch must not hash a second time beside the thread: the wait ends only when
    the thread's key is there, and the ledger shows it beside the total, not in it."""
    from foundry_core.engine.critical_path import Ledger

    release = threading.Event()
    done: list[str] = []
    module = types.ModuleType("triton.runtime.cache")
    module.triton_key = lambda: release.wait(5) and done.append("key")
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", module)
    ledger = Ledger()
    monkeypatch.setattr(triton_key, "LEDGER", ledger)
    triton_key.reset()
    try:
        thread = triton_key.warm_triton_key()
        threading.Timer(0.05, release.set).start()
        with caplog.at_level("INFO", logger="foundry"):
            waited = triton_key.wait_triton_key()
    finally:
        triton_key.reset()
    assert done == ["key"] and not thread.is_alive()
    assert waited >= 0.04
    assert "waited" in caplog.text and "Triton's cache key" in caplog.text
    assert ledger.overlapped().get("triton key wait", 0.0) >= 0.04
    assert "triton key wait" not in ledger.items()
