"""foundry_core.engine.triton_key: Triton's cache key computed once, on a thread, only when
Triton is already imported; and SGLang's LOAD starts it."""

from __future__ import annotations

import sys
import threading
import time
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


def test_waiting_without_a_thread_returns_at_once_and_starts_none(fake_triton):
    assert triton_key.wait_triton_key() == 0.0
    assert triton_key._thread is None and fake_triton == []


def _hashing_key(monkeypatch, release: threading.Event, done: list[str]):
    """An imported Triton whose lru_cache'd key blocks until ``release``."""
    import functools

    module = types.ModuleType("triton.runtime.cache")
    module.triton_key = functools.lru_cache(lambda: release.wait(5) and done.append("key") or "3.6-abc")
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", module)
    return module


def test_waiting_joins_a_thread_still_hashing(monkeypatch, caplog):
    """The first launch must not hash a second time beside the thread: the wait ends only when
    the thread's key is there, and the ledger shows it beside the total, not in it."""
    from foundry_core.engine.critical_path import Ledger

    release, done = threading.Event(), []
    _hashing_key(monkeypatch, release, done)
    ledger = Ledger()
    monkeypatch.setattr(triton_key, "LEDGER", ledger)
    triton_key.reset()
    waited: list[float] = []
    try:
        thread = triton_key.warm_triton_key()
        with caplog.at_level("INFO", logger="foundry"):
            waiter = threading.Thread(target=lambda: waited.append(triton_key.wait_triton_key()))
            waiter.start()
            time.sleep(0.1)
            assert waiter.is_alive() and thread.is_alive()  # the wait has begun, the hash goes on
            release.set()
            waiter.join(5)
    finally:
        release.set()
        triton_key.reset()
    assert done == ["key"] and not thread.is_alive() and waited[0] >= 0.1
    assert "waited" in caplog.text and "Triton's cache key" in caplog.text
    assert ledger.overlapped()["triton key wait"] >= 0.1 and "triton key wait" not in ledger.items()


def test_no_wait_when_the_key_is_cached_already_or_for_longer_than_the_limit(monkeypatch, caplog):
    release, done = threading.Event(), []
    module = _hashing_key(monkeypatch, release, done)
    triton_key.reset()
    try:
        triton_key.warm_triton_key()
        with caplog.at_level("INFO", logger="foundry"):
            waited = triton_key.wait_triton_key(limit_s=0.05)  # a hash stuck on a slow disk
        assert 0.05 <= waited < 1.0 and "still runs" in caplog.text
        module.triton_key.cache_info = lambda: types.SimpleNamespace(currsize=1)  # another caller computed it
        assert triton_key.wait_triton_key() == 0.0
    finally:
        release.set()
        triton_key.reset()
