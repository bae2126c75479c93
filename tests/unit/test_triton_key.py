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


def test_a_fork_server_computes_the_key_for_its_children_and_they_start_no_thread(monkeypatch):
    """compute_now() runs Triton's lru_cache'd key in this thread (the fork server's, after its
    imports); a process that then finds it cached (a child forked from there) starts no thread."""
    import functools

    calls: list[str] = []

    @functools.lru_cache
    def key() -> str:
        calls.append(threading.current_thread().name)
        return "3.6-abc"

    module = types.ModuleType("triton.runtime.cache")
    module.triton_key = key
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", module)
    triton_key.reset()
    said = triton_key.compute_now()
    assert said.startswith("Triton's cache key computed for the children in ")
    assert calls == [threading.current_thread().name]
    assert triton_key.warm_triton_key() is None  # cached: no thread
    assert calls == [threading.current_thread().name]
    triton_key.reset()


def test_compute_now_without_triton_or_with_a_failing_key(monkeypatch):
    for name in triton_key.MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert triton_key.compute_now() == ""
    module = types.ModuleType("triton.runtime.cache")
    module.triton_key = lambda: 1 / 0
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", module)
    assert triton_key.compute_now() == "Triton's cache key not computed (ZeroDivisionError: division by zero)"
