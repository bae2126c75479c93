"""The main process's garbage collector, paused by the early start over the engine's imports: off
until the engine's first launch through the fork server, then on with the import heap frozen; never
off for good (a bound, forked children, the switch; a vLLM that spawns its engine core:
test_vllm_fork_server.py)."""

from __future__ import annotations

import gc
import logging
import multiprocessing.process
import os
import time

import pytest

from foundry_core.engine.fork_server import client, main_gc


@pytest.fixture
def unfrozen():
    """Undoes the freeze a resume makes: this test process is no engine."""
    yield
    gc.unfreeze()


def test_paused_until_resumed_then_on_with_the_heap_frozen(unfrozen, caplog):
    assert gc.isenabled()
    assert main_gc.pause() is True
    assert not gc.isenabled() and main_gc.paused()
    assert main_gc.pause() is False  # paused already: one pause, one timer
    frozen = gc.get_freeze_count()
    with caplog.at_level(logging.INFO, logger="foundry.fork_server"):
        seconds = main_gc.resume("scheduler launched")
    assert seconds is not None and seconds >= 0.0
    assert gc.isenabled() and not main_gc.paused()
    assert gc.get_freeze_count() > frozen
    assert "garbage collection resumed in the main process (scheduler launched)" in caplog.text
    assert main_gc.resume("again") is None  # nothing paused: nothing done


def test_a_collector_already_off_is_left_off():
    gc.disable()
    try:
        assert main_gc.pause() is False
        assert main_gc.resume("a launch") is None
        assert not gc.isenabled()  # the engine's or the user's choice
    finally:
        gc.enable()


def test_the_bound_resumes_it_when_no_launch_comes(unfrozen, caplog):
    with caplog.at_level(logging.INFO, logger="foundry.fork_server"):
        assert main_gc.pause(bound_s=0.05)
        deadline = time.monotonic() + 5.0
        while "no launch within" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)  # the timer's thread logs after it turned the collector on
    assert gc.isenabled() and not main_gc.paused()
    assert "(no launch within 0 s)" in caplog.text


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_paused_collects():
    main_gc.pause()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if gc.isenabled() and not main_gc.paused() else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert main_gc.paused() and not gc.isenabled()  # the parent's pause goes on


def test_the_first_launch_ends_the_pause(unfrozen, monkeypatch):
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", lambda self: None)  # no real child
    main_gc.pause()
    client.ForkedProcess(target=print).start()
    assert gc.isenabled() and not main_gc.paused()


@pytest.mark.parametrize("switch, pauses", [("", True), ("0", False), ("off", False)])
def test_an_early_start_that_started_the_fork_server_pauses_it(monkeypatch, switch, pauses):
    monkeypatch.setenv(client.GC_FREEZE_ENV, switch)
    assert client.start_early("SGLang", lambda: True, lambda: None, "schedulers") is True
    assert main_gc.paused() is pauses and gc.isenabled() is not pauses


def test_an_early_start_that_starts_nothing_leaves_it_on(monkeypatch, capsys):
    monkeypatch.delenv(client.GC_FREEZE_ENV, raising=False)
    assert client.start_early("SGLang", lambda: False, lambda: None, "schedulers") is False
    assert gc.isenabled() and not main_gc.paused()

    def broken():
        raise OSError("no socket")

    assert client.start_early("SGLang", lambda: True, broken, "schedulers") is False
    assert gc.isenabled() and not main_gc.paused()
    assert "fork server did not start" in capsys.readouterr().err



def test_a_resume_cancels_its_timer_so_a_later_pause_lasts(unfrozen):
    main_gc.pause(bound_s=0.2)
    main_gc.resume("engine core launched", freeze=False)
    main_gc.pause(bound_s=30.0)
    time.sleep(0.5)  # past the first pause's bound
    assert main_gc.paused() and not gc.isenabled()
    main_gc.resume("the test", freeze=False)


def test_a_pause_whose_timer_cannot_start_leaves_the_collector_on(monkeypatch):
    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(main_gc.threading.Timer, "start", refuse)
    with pytest.raises(RuntimeError):
        main_gc.pause()
    assert gc.isenabled() and not main_gc.paused()


def test_an_early_start_whose_pause_fails_still_hosts_the_engine(monkeypatch, capsys):
    monkeypatch.delenv(client.GC_FREEZE_ENV, raising=False)

    def refuse(bound_s=main_gc.BOUND_S):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(main_gc, "pause", refuse)
    assert client.start_early("SGLang", lambda: True, lambda: None, "schedulers") is True
    assert "collections not paused over the engine's imports (RuntimeError" in capsys.readouterr().err
