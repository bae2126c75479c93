"""Foundry's critical-path ledger (foundry_core.engine.critical_path): its arithmetic, nesting,
the one report line and its parsing, the start-up hook's restart and early-start seconds, and the
places that record into it (registration, session, images ahead, host caches, worker phases)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import types

import pytest
from test_engine_support import FakeAdapter, FakeGraphIO, FakeRuntime

from foundry_core import autopreload as ap
from foundry_core.engine import critical_path as cp
from foundry_core.engine.host_caches import HostCaches
from foundry_core.engine.images_ahead import ImagesAhead
from foundry_core.engine.mode import Mode, Settings
from foundry_core.engine.plugin_manager import get_plugin_manager
from foundry_core.engine.registration import PluginRegistration
from foundry_core.engine.session import EngineSession
from foundry_core.engine.worker import WorkerRuntime


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def ledger(clock):
    return cp.Ledger(clock=clock, thread_clock=clock)


# ---- arithmetic and nesting ----------------------------------------------------------------


def test_add_sums_by_item_in_first_recorded_order(ledger):
    ledger.add("restart", 0.05)
    ledger.add("plugin import", 0.02)
    ledger.add("restart", 0.01)
    ledger.add("host caches", -0.5)  # a clock that went backwards adds nothing
    assert ledger.items() == pytest.approx({"restart": 0.06, "plugin import": 0.02, "host caches": 0.0})
    assert list(ledger.items()) == ["restart", "plugin import", "host caches"]
    assert ledger.total() == pytest.approx(0.08)


@pytest.mark.parametrize("name", ["", "x", "Restart", "host caches 2", "a,b", "images (wait)", "x" * 40])
def test_item_names_that_the_line_could_not_carry_are_refused(ledger, name):
    with pytest.raises(ValueError, match="critical-path item"):
        ledger.add(name, 1.0)


def test_nested_blocks_of_the_same_item_count_each_second_once(ledger, clock):
    with ledger.timed("host caches"):
        clock.step(0.1)
        with ledger.timed("host caches"):
            clock.step(0.2)
            with ledger.timed("host caches"):
                clock.step(0.3)
        clock.step(0.4)
    assert ledger.items() == pytest.approx({"host caches": 1.0})  # the outer block's wall time, not 1.0+0.5+0.3
    assert ledger.total() == pytest.approx(1.0)


def test_an_inner_item_is_taken_out_of_the_outer_one(ledger, clock):
    with ledger.timed("seams"):
        clock.step(0.1)
        with ledger.timed("host caches"):
            clock.step(0.25)
        clock.step(0.05)
    assert ledger.items() == pytest.approx({"host caches": 0.25, "seams": 0.15})
    assert ledger.total() == pytest.approx(0.4)


def test_engine_work_leaves_the_enclosing_item_and_the_total(ledger, clock):
    with ledger.timed("seams"):
        clock.step(0.1)
        with ledger.engine_work("engine imports"):
            clock.step(1.5)
            with ledger.timed("fingerprint"):  # Foundry's own work inside still counts
                clock.step(0.02)
        clock.step(0.05)
    assert ledger.items() == pytest.approx({"fingerprint": 0.02, "seams": 0.15})
    assert ledger.overlapped() == pytest.approx({"engine imports": 1.5})
    assert ledger.total() == pytest.approx(0.17)
    parsed = cp.parse_line(ledger.line(rank=0))
    assert parsed.total == pytest.approx(0.17) and parsed.overlapped == pytest.approx({"engine imports": 1.5})


def test_a_part_of_engine_work_found_to_be_foundrys_moves_into_the_total(ledger, clock):
    with ledger.engine_work("fork server imports"):
        clock.step(2.0)
    assert ledger.count_part("fork server imports", "fork server own", 0.07) == pytest.approx(0.07)
    assert ledger.items() == pytest.approx({"fork server own": 0.07})
    assert ledger.overlapped() == pytest.approx({"fork server imports": 1.93})
    # never more than the wait lasted, and nothing from an item that was not recorded
    assert ledger.count_part("fork server imports", "fork server own", 5.0) == pytest.approx(1.93)
    assert ledger.count_part("engine imports", "fork server own", 1.0) == 0.0
    assert ledger.total() == pytest.approx(2.0) and ledger.overlapped() == {}  # nothing left: no empty item


def test_a_seams_install_counts_its_module_import_as_engine_work(monkeypatch, tmp_path):
    from foundry_core.engine.patching import Patcher
    from foundry_core.engine.seam import Seam, SeamTable

    (tmp_path / "slow_engine_module.py").write_text("import time\ntime.sleep(0.2)\ndef step(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_engine_module", raising=False)
    fresh = cp.Ledger()
    monkeypatch.setattr(cp, "LEDGER", fresh)
    seam = Seam("s.step", "slow_engine_module", "step", "function", params=("x",), purpose="a test seam")
    table = SeamTable(engine="E", package="slow_engine_module", tested_versions=("1",), seams=(seam,))
    with fresh.timed("seams"):
        Patcher(table).install("s.step", lambda f: (lambda x: f(x) + 1))
    assert sys.modules["slow_engine_module"].step(1) == 2
    assert fresh.overlapped()["engine imports"] >= 0.2
    assert fresh.items()["seams"] < 0.1


def test_a_block_that_raises_still_counts(ledger, clock):
    with pytest.raises(RuntimeError):
        with ledger.timed("archive check"):
            clock.step(0.2)
            raise RuntimeError("stale")
    assert ledger.items() == pytest.approx({"archive check": 0.2})


def test_foundry_threads_add_their_cpu_time_beside_the_total_not_to_it(ledger, clock):
    with ledger.background("images thread cpu"):
        clock.step(0.3)
        with ledger.timed("host caches"):  # on Foundry's own thread: the start does not wait for it
            clock.step(0.2)
    with ledger.timed("images wait"):
        clock.step(0.01)
    assert ledger.items() == pytest.approx({"images wait": 0.01})
    assert ledger.overlapped() == pytest.approx({"images thread cpu": 0.5})
    assert ledger.total() == pytest.approx(0.01)


def test_background_marks_only_its_own_thread():
    ledger = cp.Ledger()
    inside, release = threading.Event(), threading.Event()

    def thread_body():
        with ledger.background("caches thread cpu"):
            inside.set()
            release.wait(5)

    t = threading.Thread(target=thread_body)
    t.start()
    inside.wait(5)
    with ledger.timed("host caches"):  # this thread is the engine's
        pass
    release.set()
    t.join()
    assert "host caches" in ledger.items() and "caches thread cpu" in ledger.overlapped()


# ---- the line, once per process ------------------------------------------------------------------


def test_the_line(ledger):
    ledger.add("restart", 0.0504)
    ledger.add("plugin import", 0.031)
    ledger.add_overlapped("images thread cpu", 0.09)
    assert ledger.line(rank=0) == ("foundry: critical path in this process (rank 0): 0.081 s (restart 0.050, "
                                   "plugin import 0.031); overlapped, not in the total: images thread cpu 0.090")
    assert cp.Ledger().line() == "foundry: critical path in this process: 0.000 s"


def test_report_logs_one_line_once(ledger, caplog):
    log = logging.getLogger("test_critical_path")
    ledger.add("archive check", 0.02)
    with caplog.at_level(logging.INFO, logger=log.name):
        assert ledger.report(log, rank=1) is True
        ledger.add("host caches", 0.5)
        assert ledger.report(log, rank=1) is False
        assert ledger.report_at_exit(log) is False
    assert [r.getMessage() for r in caplog.records] == [
        "foundry: critical path in this process (rank 1): 0.020 s (archive check 0.020)"]


def test_reset_forgets_the_items_and_a_block_open_across_it(ledger, clock):
    with ledger.timed("host caches"):
        ledger.add("restart", 0.1)
        ledger.report(logging.getLogger("test_critical_path"))
        ledger.reset()
        clock.step(0.5)
    assert ledger.items() == {} and not ledger.reported


def test_at_exit_reports_only_when_something_was_recorded(ledger, caplog):
    log = logging.getLogger("test_critical_path")
    with caplog.at_level(logging.INFO, logger=log.name):
        assert ledger.report_at_exit(log) is False
        ledger.add("restart", 0.1)
        assert ledger.report_at_exit(log) is True
    assert [r.getMessage() for r in caplog.records] == [
        "foundry: critical path in this process: 0.100 s (restart 0.100)"]


def test_the_process_ledger_is_reported_at_exit(tmp_path):
    script = ("import logging, sys\n"
              "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(message)s')\n"
              "from foundry_core.engine.critical_path import LEDGER\n"
              "LEDGER.add('plugin import', 0.125)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == (
        "foundry: critical path in this process: 0.125 s (plugin import 0.125)")
    quiet = subprocess.run([sys.executable, "-c", script.replace("LEDGER.add('plugin import', 0.125)", "")],
                           capture_output=True, text=True, timeout=60, check=True)
    assert "critical path" not in quiet.stdout + quiet.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_starts_with_an_empty_ledger():
    before = cp.LEDGER.items()
    cp.LEDGER.add("restart", 0.001)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: says what its ledger holds, then leaves without running atexit
        os.close(read)
        os.write(write, json.dumps([cp.LEDGER.items(), cp.LEDGER.reported]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        items, reported = json.loads(f.read())
    os.waitpid(pid, 0)
    assert items == {} and reported is False
    assert cp.LEDGER.items()["restart"] == pytest.approx(before.get("restart", 0.0) + 0.001)  # the parent's stays


# ---- reading the line back ------------------------------------------------------------------------


def test_parse_a_line_from_an_engine_log():
    vllm = ("(EngineCore pid=4321) INFO 11-30 10:36:59 [worker.py:282] foundry: critical path in this process "
            "(rank 0): 0.123 s (fingerprint 0.004, archive check 0.020, host caches 0.015, images wait 0.084); "
            "overlapped, not in the total: images thread cpu 0.210, triton key thread cpu 0.350")
    line = cp.parse_line(vllm)
    assert line == cp.ReportedLine(0, 0.123, {"fingerprint": 0.004, "archive check": 0.02, "host caches": 0.015,
                                              "images wait": 0.084},
                                   {"images thread cpu": 0.21, "triton key thread cpu": 0.35})
    first = cp.parse_line("INFO 05-09 07:35:25 [foundry.sglang] foundry: critical path in this process: 0.071 s "
                          "(restart 0.052, early start 0.011, plugin import 0.003, seams 0.005)")
    assert first is not None and first.rank is None and first.total == 0.071
    assert list(first.items) == ["restart", "early start", "plugin import", "seams"] and not first.overlapped
    assert cp.parse_line("foundry: restored 8 decode graphs in 0.13 s") is None


def test_the_line_round_trips(ledger):
    ledger.add("restart", 0.0504)
    ledger.add("host caches", 0.2)
    ledger.add_overlapped("caches thread cpu", 1.5)
    line = cp.parse_line("[2026-11-29 10:36:47 TP0] " + ledger.line(rank=3))
    assert line == cp.ReportedLine(3, 0.25, {"restart": 0.05, "host caches": 0.2}, {"caches thread cpu": 1.5})


def test_a_start_adds_its_first_processes_to_its_slowest_rank():
    api = cp.ReportedLine(None, 0.08, {"restart": 0.06, "plugin import": 0.02}, {})
    core = cp.ReportedLine(None, 0.01, {"plugin import": 0.01}, {})
    rank0 = cp.ReportedLine(0, 0.10, {"archive check": 0.04, "images wait": 0.06}, {"images thread cpu": 0.2})
    rank1 = cp.ReportedLine(1, 0.15, {"archive check": 0.05, "images wait": 0.10}, {"images thread cpu": 0.3})
    combined = cp.combine([api, rank0, core, rank1])
    assert combined.total == pytest.approx(0.24)  # 0.08 + 0.01 + max(0.10, 0.15)
    assert combined.items == pytest.approx({"restart": 0.06, "plugin import": 0.03, "archive check": 0.05,
                                            "images wait": 0.10})
    assert combined.overlapped == pytest.approx({"images thread cpu": 0.3}) and combined.lines == 4
    assert cp.combine([]) is None


# ---- the start-up hook: restart and early starts ------------------------------------------------------------


@pytest.fixture
def hook(monkeypatch):
    """The start-up hook's module with its own, empty start-up state."""
    monkeypatch.setattr(ap, "startup_seconds", {})
    monkeypatch.setattr(ap, "startup_pid", None)
    monkeypatch.setattr(ap, "early_start_began", None)
    monkeypatch.setattr(ap, "early_start_ended", None)
    return ap


def test_the_restart_passes_when_it_was_decided(monkeypatch):
    calls = []
    monkeypatch.setattr(sys, "argv", ["app.py", "--foundry-archive", "/a"])
    monkeypatch.setattr(sys, "orig_argv", ["python3", "app.py", "--foundry-archive", "/a"], raising=False)
    for name in ("LD_PRELOAD", "FOUNDRY_AUTOPRELOAD", "FOUNDRY_AUTOPRELOAD_RESTARTED", "FOUNDRY_MODE",
                 ap.RESTART_AT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("foundry_core.preload.preload_path", lambda: "/opt/foundry/libfoundry.so")
    before = time.time()
    assert ap.maybe_reexec(lambda path, args, env: calls.append(env))
    stamp = float(calls[0][ap.RESTART_AT_ENV])
    assert before <= stamp <= time.time()
    assert ap.RESTART_AT_ENV not in os.environ  # only the restarted process gets it


def test_the_restarted_hook_notes_the_restart_and_removes_the_variable(hook):
    environ = {ap.RESTART_AT_ENV: "1000.25", "OTHER": "x"}
    assert hook.note_restart(environ, now=lambda: 1000.5) == pytest.approx(0.25)
    assert environ == {"OTHER": "x"}
    assert hook.startup_seconds == pytest.approx({"restart": 0.25}) and hook.startup_pid == os.getpid()
    assert hook.note_restart(environ, now=lambda: 1000.5) is None  # read once


@pytest.mark.parametrize("value", ["soon", "nan", "2000.0", "-1e9"])
def test_an_unusable_restart_stamp_is_dropped(hook, value):
    environ = {ap.RESTART_AT_ENV: value}
    assert hook.note_restart(environ, now=lambda: 1000.0) is None
    assert environ == {} and hook.startup_seconds == {}


def test_the_restarted_process_reads_the_stamp_and_its_children_do_not_see_it(tmp_path):
    """Two real interpreters: the first restarts itself through maybe_reexec, the second notes the
    restart (as at_startup does) and starts a child that looks for the variable."""
    script = tmp_path / "restart.py"
    script.write_text(
        "import json, os, subprocess, sys\n"
        "from foundry_core import autopreload as ap, preload\n"
        "if os.environ.get('PROBE_RESTARTED') != '1':\n"
        "    preload.preload_path = lambda: '/nonexistent/libfoundry.so'\n"
        "    os.environ['PROBE_RESTARTED'] = '1'\n"
        "    os.environ.pop('FOUNDRY_AUTOPRELOAD', None)\n"
        "    ap.maybe_reexec()\n"
        "    sys.exit('not restarted')\n"
        "seconds = ap.note_restart()\n"
        # An installed start-up hook of this version noted it already, at interpreter start-up.
        "hook = sys.modules.get('_foundry_autopreload')\n"
        "if seconds is None and hook is not None:\n"
        "    seconds = getattr(hook, 'startup_seconds', {}).get('restart')\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(%r))' % ap.RESTART_AT_ENV],\n"
        "                       capture_output=True, text=True).stdout.strip()\n"
        "print(json.dumps({'seconds': seconds, 'left': os.environ.get(ap.RESTART_AT_ENV), 'child': child}))\n")
    # FOUNDRY_AUTOPRELOAD=0 keeps an installed start-up hook out of this (the script drops it itself
    # before its own restart); no early starts in the restarted interpreter.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOUNDRY_") and k != "LD_PRELOAD"}
    env.update(FOUNDRY_AUTOPRELOAD="0", FOUNDRY_EARLY_START="0", FOUNDRY_ARCHIVE=str(tmp_path / "archive"))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.0 < result["seconds"] < 30.0
    assert result["left"] is None and result["child"] == "None"


def test_early_starts_are_timed(hook, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["m.py"])
    monkeypatch.setenv("LD_PRELOAD", "/site/foundry_core/libfoundry.so")
    monkeypatch.setenv("FOUNDRY_ARCHIVE", "/a")
    monkeypatch.delenv("FOUNDRY_MODE", raising=False)
    monkeypatch.delenv("FOUNDRY_EARLY_START", raising=False)
    monkeypatch.delenv("FOUNDRY_AUTOPRELOAD_RESTARTED", raising=False)
    seen = []

    class Slow:
        name = "slow"

        def load(self):
            def start():
                seen.append(cp.import_seconds(time.perf_counter(), hook))  # a plugin imported in here
                time.sleep(0.05)
            return start

    assert hook.run_early_starts(lambda: [Slow()]) == (1, False)
    assert seen == [0.0]  # counted as the early start's, not again as the plugin's import
    assert hook.startup_seconds["early start"] >= 0.05
    assert cp.import_seconds(time.perf_counter() - 0.5, hook) >= 0.5  # after the early starts: the import's own


def test_take_startup_moves_the_hooks_seconds_once_and_only_in_its_process(hook, ledger):
    hook.note_restart({ap.RESTART_AT_ENV: "10.0"}, now=lambda: 10.3)
    hook._note("early start", 0.02)
    assert cp.take_startup(ledger, hook) == pytest.approx({"restart": 0.3, "early start": 0.02})
    assert cp.take_startup(ledger, hook) == {}
    assert ledger.items() == pytest.approx({"restart": 0.3, "early start": 0.02})
    other = types.SimpleNamespace(startup_seconds={"restart": 1.0}, startup_pid=os.getpid() + 1)
    assert cp.take_startup(ledger, other) == {}  # a forked child sees its parent's values
    assert cp.take_startup(ledger, types.SimpleNamespace()) == {}  # an installed hook from before this ledger


# ---- the places that record ------------------------------------------------------------------------------


def test_registration_counts_import_and_seams_once_foundry_is_active(monkeypatch, tmp_path, ledger, clock):
    for name in ("FOUNDRY_ARCHIVE", "FOUNDRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("foundry_core.engine.registration.setup_logging", lambda: None)
    reg = PluginRegistration("test-foundry", logging.getLogger("test_critical_path"), ledger=ledger)
    reg.register(lambda: clock.step(0.01), lambda s: None, imported_s=0.25)
    assert ledger.items() == {}  # Foundry off (so far): an unmodified start records nothing

    def seams():
        clock.step(0.04)
        with ledger.timed("host caches"):
            clock.step(0.5)

    settings = Settings(Mode.LOAD, tmp_path, "flag", "flag")
    reg.activate(settings, lambda s: {}, seams)
    reg.activate(settings, lambda s: {}, seams)  # later activations only export the environment
    items = ledger.items()
    assert items["plugin import"] >= 0.25 and items["seams"] == pytest.approx(0.04)
    assert items["host caches"] == pytest.approx(0.5)


def test_the_session_counts_its_fingerprint_and_archive_check(tmp_path, monkeypatch):
    FakeGraphIO().install(monkeypatch)
    before = cp.LEDGER.items()
    EngineSession(tmp_path / "archive", "auto", 0, get_plugin_manager(FakeAdapter()), runtime=FakeRuntime(),
                  environ={})
    after = cp.LEDGER.items()
    assert after.get("fingerprint", 0.0) > before.get("fingerprint", 0.0)
    assert after.get("archive check", 0.0) > before.get("archive check", 0.0)


def test_images_ahead_count_the_wait_and_not_the_thread():
    before, overlapped = cp.LEDGER.items(), cp.LEDGER.overlapped()

    def load():
        end = time.thread_time() + 0.02
        while time.thread_time() < end:  # CPU time on the thread
            pass
        time.sleep(0.2)

    ahead = ImagesAhead(load, lambda: None).start()
    waited = ahead.wait()
    grew = cp.LEDGER.items().get("images wait", 0.0) - before.get("images wait", 0.0)
    assert grew == pytest.approx(waited, abs=0.01) and waited > 0.05
    cpu = cp.LEDGER.overlapped().get("images thread cpu", 0.0) - overlapped.get("images thread cpu", 0.0)
    assert 0.015 <= cpu < 0.2  # its CPU time, not its sleep


def test_host_caches_count_on_the_engines_thread_only(tmp_path):
    rank = tmp_path / "rank0"
    rank.mkdir()
    (rank / "host_caches.json").write_text("not json")

    def host_caches_s() -> float:
        return cp.LEDGER.items().get("host caches", 0.0)

    start = host_caches_s()
    box = {}
    t = threading.Thread(target=lambda: box.update(s=_read_in_background(tmp_path, rank, host_caches_s)))
    t.start()
    t.join()
    assert box["s"] == start  # Foundry's own thread: nothing on the critical path
    assert HostCaches.read(tmp_path, rank) is None  # an unreadable list is none
    assert host_caches_s() > start


def _read_in_background(archive, rank, host_caches_s) -> float:
    with cp.LEDGER.background("caches thread cpu"):
        HostCaches.read(archive, rank)
    return host_caches_s()


class _Session:
    def __init__(self) -> None:
        self.mode, self.rank = Mode.LOAD, 2

    def end(self) -> None:
        pass


def test_the_worker_reports_when_its_outermost_phase_ends(ledger, caplog):
    rt = WorkerRuntime(_Session(), adapter=None)
    rt.ledger, rt.logger = ledger, logging.getLogger("test_critical_path")
    rt.capture_seen = True
    ledger.add("archive check", 0.01)
    with caplog.at_level(logging.INFO, logger="test_critical_path"):
        with rt.in_phase("warmup", "serving", "warmup"):
            with rt.in_phase("capture", "warmup", "capture"):
                pass
            assert not ledger.reported  # the inner phase (the capture) is not the end yet
            ledger.add("host caches", 0.02)  # the JIT warmup after it still counts
    lines = [r.getMessage() for r in caplog.records if "critical path" in r.getMessage()]
    assert lines == ["foundry: critical path in this process (rank 2): 0.030 s (archive check 0.010, "
                     "host caches 0.020)"]


def test_an_import_counts_in_its_process_and_not_in_a_child_forked_after_it():
    imported = cp.import_time(time.perf_counter() - 0.25, hook=object())
    assert imported.here() >= 0.25
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: did not wait for its parent's import
        os.write(write, repr(imported.here()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert float(os.read(read, 64)) == 0.0


def test_the_hooks_engine_imports_are_beside_the_total(hook, ledger):
    """What finding the early starts imports of the engine's own modules is the engine's work done
    earlier: shown beside the total, not in it."""
    hook._note("early start", 0.03)
    hook._note(hook.ENGINE_WORK, 0.05)
    cp.take_startup(ledger, hook)
    assert ledger.items() == pytest.approx({"early start": 0.03})
    assert ledger.overlapped() == pytest.approx({"engine imports": 0.05})
