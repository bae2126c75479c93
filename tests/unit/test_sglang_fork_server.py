"""sglang-foundry's fork server: when SGLang's children are forked from it and when they are
spawned, that a forked child runs under the main process's environment as it was at start(), and
the switch that turns it off. The end-to-end cases run multiprocessing's real fork server over a
synthetic ``sglang`` package written by the test."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from plugin_support import early_start_installed, fork_server_started_by_the_hook  # noqa: E402

from foundry_core.engine.fork_server import client, device_facts, preload
from sglang_foundry import fork_server as fs

# ---- which commands start SGLang's server -------------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    (["python3", "-m", "sglang.launch_server", "--model-path", "m"], True),
    (["python3", "-u", "-m", "sglang.launch_server"], True),
    (["python3", "-msglang.launch_server"], True),
    (["/usr/bin/python3", "/venv/bin/sglang", "serve", "--model-path", "m"], True),
    (["python3", "/venv/bin/sglang", "version"], False),
    (["python3", "-m", "sglang.bench_serving"], False),
    (["python3", "-c", "import sglang"], False),
    (["python3", "script.py", "-m", "sglang.launch_server"], False),
    (["python3"], False),
])
def test_only_the_server_commands_start_a_fork_server(argv, expected):
    assert fs.starts_server(argv) is expected


@pytest.mark.parametrize("value, expected", [("", True), ("1", True), ("0", False), ("off", False), ("No", False)])
def test_the_switch(value, expected):
    assert fs.enabled({fs.SWITCH_ENV: value}) is expected


def test_switched_off_nothing_starts(monkeypatch):
    monkeypatch.setenv(fs.SWITCH_ENV, "0")
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "sglang.launch_server"])
    monkeypatch.setattr(fs, "start", lambda *a, **k: pytest.fail("the fork server started although switched off"))
    assert fs.start_early() is False  # the start-up hook restarts the main process under the preload


def test_a_started_fork_server_hosts_the_schedulers(monkeypatch):
    monkeypatch.delenv(fs.SWITCH_ENV, raising=False)
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "sglang.launch_server"])
    monkeypatch.setattr(fs, "start", lambda *a, **k: "/tmp/status.json")
    assert fs.start_early() is True  # the main process is left without the preload


def test_a_failing_start_is_reported_and_swallowed(monkeypatch, capsys):
    monkeypatch.delenv(fs.SWITCH_ENV, raising=False)
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "sglang.launch_server"])

    def broken(*_a, **_k):
        raise OSError("no socket")

    monkeypatch.setattr(fs, "start", broken)
    assert fs.start_early() is False
    assert "fork server did not start (OSError: no socket)" in capsys.readouterr().err


# ---- the launch decision ------------------------------------------------------------------


def _state(status: dict | None, ld_preload: str = "") -> client._State:
    state = client._State()
    if status is not None:
        state.started("/nonexistent/status.json", ld_preload, "SGLang", fs.CHILD_NAMES)
        state._status = status
    return state


SAFE = {"safe": True, "why": ""}


def test_a_child_is_forked_when_nothing_stands_against_it():
    assert client.spawn_reason(_state(SAFE), {}, sys.executable) is None


@pytest.mark.parametrize("state, env, exe, words", [
    (_state(None), {}, sys.executable, "no fork server is running"),
    (_state(SAFE), {}, "/tmp/numactl-wrapper.sh", "NUMA binding"),
    (_state(SAFE, "/lib/libfoundry.so"), {"LD_PRELOAD": "/lib/libfoundry.so:/lib/torch_memory_saver.so"},
     sys.executable, "another LD_PRELOAD"),
    (_state({"safe": False, "why": "importing SGLang loaded the CUDA driver"}), {}, sys.executable,
     "not safe to fork from: importing SGLang loaded the CUDA driver"),
])
def test_a_child_is_spawned_with_the_reason(state, env, exe, words):
    reason = client.spawn_reason(state, env, exe)
    assert reason is not None and words in reason


def test_the_status_is_awaited_until_the_server_writes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(client, "_server_alive", lambda: True)
    path = tmp_path / "status.json"
    threading.Timer(0.3, lambda: preload.write_status(str(path), {"safe": True, "why": ""})).start()
    start = time.monotonic()
    assert client.read_status(str(path), timeout_s=10)["safe"] is True
    assert time.monotonic() - start >= 0.25


def test_a_wait_for_the_fork_server_counts_only_its_own_steps_on_the_critical_path(tmp_path, monkeypatch):
    """The wait is the engine's imports, shown beside the total; the fork server's own steps
    within it (placement before the imports, driver watch, checks) are in the total."""
    from foundry_core.engine.critical_path import LEDGER

    monkeypatch.setattr(client, "_server_alive", lambda: True)
    monkeypatch.setattr(LEDGER, "reported", True)  # no line at this test process's exit
    LEDGER.reset()
    state, path = client._State(), tmp_path / "status.json"
    state.status_path = str(path)
    status = {"safe": True, "why": "", "before_s": 0.02, "watch_s": 0.05, "checks_s": 0.01}
    threading.Timer(0.3, lambda: preload.write_status(str(path), status)).start()
    assert state.status(timeout_s=10)["safe"] is True
    assert LEDGER.items()[client.OWN_ITEM] == pytest.approx(0.08)
    assert LEDGER.overlapped()[client.WAIT_ITEM] >= 0.25 - 0.08
    assert LEDGER.total() == pytest.approx(0.08)
    LEDGER.reset()
    state._status, path = None, tmp_path / "already.json"
    preload.write_status(str(path), status)
    state.status_path = str(path)
    assert state.status()["safe"] is True and not LEDGER.recorded()  # written before: no wait, nothing counted


def test_a_short_wait_counts_no_more_than_it_lasted(tmp_path, monkeypatch):
    from foundry_core.engine.critical_path import LEDGER

    monkeypatch.setattr(client, "_server_alive", lambda: True)
    monkeypatch.setattr(LEDGER, "reported", True)
    LEDGER.reset()
    state, path = client._State(), tmp_path / "status.json"
    state.status_path = str(path)
    threading.Timer(0.1, lambda: preload.write_status(str(path), {"safe": True, "why": "", "watch_s": 30.0,
                                                                  "checks_s": "?"})).start()
    try:
        state.status(timeout_s=10)
        waited, overlapped = LEDGER.items()[client.OWN_ITEM], LEDGER.overlapped()
    finally:
        LEDGER.reset()
    assert 0.05 <= waited < 30.0 and client.WAIT_ITEM not in overlapped  # all of the wait was its own steps


def test_a_status_that_never_comes_spawns(tmp_path, monkeypatch):
    monkeypatch.setattr(client, "_server_alive", lambda: True)
    status = client.read_status(str(tmp_path / "never.json"), timeout_s=0.2)
    assert status["safe"] is False and "had not finished importing" in status["why"]


def test_a_dead_fork_server_spawns_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(client, "_server_alive", lambda: False)
    start = time.monotonic()
    status = client.read_status(str(tmp_path / "never.json"), timeout_s=60)
    assert status["safe"] is False and "exited" in status["why"]
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("content", ["[1, 2]", "{\"safe\": \"yes\"}", "{not json"])
def test_a_malformed_status_spawns(tmp_path, content):
    path = tmp_path / "status.json"
    path.write_text(content)
    assert client.read_status(str(path), timeout_s=1)["safe"] is False


def test_a_forked_child_takes_the_environment_of_its_start(monkeypatch):
    seen = {}
    target = client.InEnviron({"ONLY": "this"}, lambda x: seen.update(x=x, env=dict(os.environ),
                                                                     frozen=gc.get_freeze_count()))
    monkeypatch.setenv("STALE", "from the fork server")
    saved = dict(os.environ)
    try:
        target(3)
    finally:
        gc.unfreeze()  # this test process is no forked child
        os.environ.clear()
        os.environ.update(saved)
    assert seen.pop("frozen") > 0  # the heap it started with is frozen before the target runs
    assert seen == {"x": 3, "env": {"ONLY": "this"}}


def test_the_engine_module_view_forks_only_processes():
    import multiprocessing

    view = client.ForkingMultiprocessing(multiprocessing)
    assert view.Process is client.ForkedProcess
    assert view.Pipe is multiprocessing.Pipe and view.set_start_method is multiprocessing.set_start_method


# ---- the fork server's own checks ---------------------------------------------------------


LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"


def _maps(tmp_path, *paths):
    maps = tmp_path / "maps"
    maps.write_text("".join(f"7f00-7f01 r-xp 00000000 00:00 0          {p}\n" for p in paths))
    return str(maps)


def test_a_fork_server_that_initialised_the_driver_is_unsafe(tmp_path):
    reason = preload.unsafe_reason(_maps(tmp_path, "/usr/lib/libc.so.6", LIBCUDA), initialised=lambda p: True)
    assert reason is not None and "initialised the CUDA driver" in reason and LIBCUDA in reason


def test_a_driver_mapped_but_not_initialised_is_safe(tmp_path):
    asked = []
    maps = _maps(tmp_path, LIBCUDA)
    reason = preload.unsafe_reason(maps, initialised=lambda p: asked.append(p) or False)
    assert reason is None or "threads" in reason  # this test process may run threads of its own
    assert asked == [LIBCUDA]


def test_without_the_driver_it_is_not_asked(tmp_path):
    maps = _maps(tmp_path, "/usr/lib/libc.so.6")
    reason = preload.unsafe_reason(maps, initialised=lambda p: pytest.fail("asked without a driver"))
    assert reason is None or "threads" in reason


def test_when_it_cannot_tell_it_is_unsafe(tmp_path):
    def broken(_path):
        raise OSError("no such symbol")

    assert "cannot tell" in preload.unsafe_reason(_maps(tmp_path, LIBCUDA), initialised=broken)


def test_a_fork_server_with_a_thread_is_unsafe(tmp_path):
    maps = _maps(tmp_path)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="engine-import-helper")
    t.start()
    try:
        assert "engine-import-helper" in preload.unsafe_reason(maps)
    finally:
        stop.set()
        t.join()
    # Other tests of this process may leave threads of their own: only this one must be gone.
    assert "engine-import-helper" not in (preload.unsafe_reason(maps) or "")


def test_a_failed_import_is_written_not_raised(tmp_path):
    path = tmp_path / "status.json"
    status = preload.run(modules=("no_such_module_here",), path=str(path))
    assert status["safe"] is False and "ModuleNotFoundError" in status["why"]
    assert json.loads(path.read_text()) == status


# ---- end to end: multiprocessing's fork server over a synthetic SGLang ---------------------

SCHEDULER = """
import gc, json, os, threading
IMPORTED_IN = os.getpid()
# Whether the fork server's step before its imports had placed this file by now (the test's archive).
PLACED_AT_IMPORT = os.path.exists(os.environ.get("EXPECT_PLACED", "/nonexistent"))
if os.environ.get("FAKE_SGLANG_THREAD"):
    threading.Thread(target=threading.Event().wait, name="fake-sglang-worker", daemon=True).start()

def run_scheduler_process(out):
    with open(out, "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "imported_in": IMPORTED_IN,
                   "mark": os.environ.get("MARK"), "status_env": os.environ.get("%s"),
                   "placed_at_import": PLACED_AT_IMPORT, "frozen": gc.get_freeze_count()}, f)
"""

DRIVER = """
import json, logging, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the synthetic sglang: not on PYTHONPATH
from foundry_core.engine.fork_server import client
from sglang_foundry import fork_server as fs
from sglang.srt.managers import scheduler

if __name__ == "__main__":  # a child imports this file again, as SGLang's children import launch_server
    logging.basicConfig(level=logging.INFO)
    fs.start()
    os.environ["MARK"] = "set after the fork server started"
    out = sys.argv[1]
    p = client.ForkedProcess(target=scheduler.run_scheduler_process, args=(out,))
    p.start()
    p.join(60)
    child = json.load(open(out))
    child.update(main=os.getpid(), exitcode=p.exitcode, status=client._STATE.status())
    print(json.dumps(child))
"""


def _run_driver(tmp_path: Path, *args: str, **env: str) -> tuple[dict, str]:
    pkg = tmp_path / "sglang" / "srt" / "managers"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "scheduler.py").write_text(SCHEDULER % client.STATUS_ENV)
    (pkg / "detokenizer_manager.py").write_text("")
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    # The fork server must import from this process's sys.path, which Python 3.12 and older do not
    # hand it (only PYTHONPATH): the synthetic package is on the first alone.
    proc = subprocess.run([sys.executable, str(driver), str(tmp_path / "child.json"), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TMPDIR": str(tmp_path), **env})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_child_is_forked_from_a_server_that_imported_sglang(tmp_path):
    child, log = _run_driver(tmp_path)
    assert "scheduler is forked from the fork server (which imported SGLang in" in log
    assert child["exitcode"] == 0
    assert child["status"]["safe"] is True
    assert child["imported_in"] != child["pid"]  # the module was imported before the fork
    assert child["ppid"] != child["main"]  # its parent is the fork server
    assert child["mark"] == "set after the fork server started"  # the main process's environment
    assert child["status_env"] is None  # the fork server's own variables stay there
    assert child["frozen"] > 1000  # the heap inherited from the fork server's imports, out of the collector's walks


def test_a_forked_childs_heap_can_be_left_to_the_collector(tmp_path):
    child, _ = _run_driver(tmp_path, FOUNDRY_FORK_GC_FREEZE="Off")
    assert child["exitcode"] == 0 and child["frozen"] == 0
    assert child["status"]["gc_paused"] is False  # the fork server collected during its imports too


def test_the_fork_server_does_not_collect_while_it_imports_then_freezes_what_they_made():
    import gc

    assert gc.isenabled()
    before = gc.get_freeze_count()
    try:
        with preload.collections_paused():
            assert not gc.isenabled()
            made = [[] for _ in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(made)
    finally:
        gc.unfreeze()
    with preload.collections_paused(paused=False):
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_the_status_says_whether_the_imports_ran_without_collections(tmp_path, monkeypatch):
    import gc

    # Each module records, as it is imported, whether the collector was on.
    for name in ("paused_probe", "collected_probe"):
        (tmp_path / f"{name}.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert preload.run(modules=("paused_probe",), path=str(tmp_path / "s.json"))["gc_paused"] is True
        assert sys.modules["paused_probe"].COLLECTING is False
        monkeypatch.setenv(client.GC_FREEZE_ENV, "no")
        assert preload.run(modules=("collected_probe",), path=str(tmp_path / "s.json"))["gc_paused"] is False
        assert sys.modules["collected_probe"].COLLECTING is True
    finally:
        gc.unfreeze()
        for name in ("paused_probe", "collected_probe"):
            sys.modules.pop(name, None)


def test_the_freeze_switch_reads_as_the_engine_options_do():
    from foundry_core.engine.options import FALSE_VALUES

    assert set(client.OFF_WORDS) == set(FALSE_VALUES)


def test_a_load_places_tritons_modules_built_at_import_before_the_fork_servers_imports(tmp_path):
    """SGLang's imports build Triton's cuda_utils: the fork server of a LOAD places the archive's
    copy before it imports anything (the synthetic scheduler module looks at import time)."""
    from foundry_core.engine import triton_at_import as tai
    from foundry_core.engine.host_caches import HostCaches
    from foundry_core.engine.layout import rank_dir

    saving, key = tmp_path / "saving-host", "ab" * 32
    (saving / key).mkdir(parents=True)
    (saving / key / "cuda_utils.so").write_bytes(b"module")
    archive = tmp_path / "archive"
    rank_dir(archive, 0).mkdir(parents=True)
    caches = HostCaches(archive, rank_dir(archive, 0))
    caches.add_used(tai.tree(saving, mapped=[saving / key / "cuda_utils.so"]))
    caches.write_list()

    new_host = tmp_path / "new-host"
    child, log = _run_driver(tmp_path, "--foundry-archive", str(archive), "--foundry-mode", "load",
                             TRITON_CACHE_DIR=str(new_host), EXPECT_PLACED=str(new_host / key / "cuda_utils.so"))
    assert child["placed_at_import"] is True and child["exitcode"] == 0
    assert "the fork server, before importing SGLang: Triton's modules built at import, from the archive: 1 files" \
        in log
    assert child["status"]["before"].endswith("1 files (0.0 MiB) copied, 0 present")


def test_a_failing_step_before_the_imports_is_written_and_the_imports_go_on(tmp_path, monkeypatch):
    def broken() -> str:
        raise ValueError("bad archive path")

    monkeypatch.setattr(preload, "unsafe_reason", lambda *a, **k: None)  # other tests' threads aside
    status = preload.run(modules=("json",), path=str(tmp_path / "status.json"), before=broken)
    assert status["safe"] is True  # the imports went on
    assert status["before"] == "the step before the imports failed (ValueError: bad archive path)"


def test_an_unsafe_fork_server_makes_the_child_spawn_and_says_why(tmp_path):
    child, log = _run_driver(tmp_path, FAKE_SGLANG_THREAD="1")
    assert child["exitcode"] == 0
    assert child["status"]["safe"] is False and "fake-sglang-worker" in child["status"]["why"]
    assert child["imported_in"] == child["pid"]  # spawned: it imported the module itself
    assert child["ppid"] == child["main"]
    assert child["mark"] == "set after the fork server started"
    assert "scheduler is spawned, not forked from the fork server" in log and "fake-sglang-worker" in log


@pytest.mark.skipif(not early_start_installed("sglang"), reason="needs foundry-core's start-up hook and sglang-foundry's "
                    "entry point installed (`pip install -e . -e plugins/sglang_foundry`)")
@pytest.mark.parametrize("env, running", [({}, True), ({fs.SWITCH_ENV: "0"}, False), ({"FOUNDRY_MODE": "off"}, False)])
@pytest.mark.parametrize("preloaded", [False, True])
def test_the_start_up_hook_starts_the_fork_server_for_sglangs_server(tmp_path, env, running, preloaded):
    assert fork_server_started_by_the_hook(tmp_path, "sglang.launch_server", ["--model-path", "m"], env, preloaded) is running


# ---- device queries answered from NVML during the fork server's imports -------------------



class _FakeNvml:
    def __init__(self):
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"handle{i}"

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=150 << 30)


def _fake_torch():
    def refuse(*_a, **_k):
        raise AssertionError("CUDA initialised: a real torch.cuda query ran")

    cuda = types.SimpleNamespace(current_device=refuse, get_device_properties=refuse, get_device_capability=refuse,
                                 get_device_name=refuse, _get_nvml_device_index=lambda i: {0: 3, 1: 5}[i])
    torch = types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace(_get_accelerator=refuse),
                                  device=lambda kind: types.SimpleNamespace(type=kind))

    def get_device_module():  # as torch's, which asks the accelerator when given no device
        return getattr(torch, torch._C._get_accelerator().type)

    torch.get_device_module = get_device_module
    return torch


def _queries(torch):
    return {q: getattr(*device_facts.owner(torch, q)) for q in device_facts.QUERIES}


def test_the_device_queries_answer_from_nvml_and_come_back():
    torch, nvml = _fake_torch(), _FakeNvml()
    originals = _queries(torch)
    with device_facts.answered_from(torch, device_facts.nvml_facts(torch, nvml)):
        # What sgl_kernel asks at import to choose its kernel library.
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        assert props.major * 10 + props.minor == 90
        assert torch.cuda.get_device_capability("cuda:1") == (9, 0)
        assert torch.cuda.get_device_name() == "NVIDIA H200" and props.total_memory == 150 << 30
        # What SGLang's parallel_state and cache_controller ask at import.
        assert torch.get_device_module() is torch.cuda
    assert _queries(torch) == originals
    assert nvml.inits == 1


def test_a_stand_in_a_module_kept_calls_torchs_own_after_the_imports(monkeypatch, tmp_path):
    torch, nvml = _fake_torch(), _FakeNvml()
    torch.cuda.current_device = lambda: 1  # torch's own, as after torch.cuda.set_device(1)
    monkeypatch.setitem(sys.modules, "fake_torch_for_stand_ins", torch)
    # An engine module doing `from torch.cuda import current_device` at import.
    (tmp_path / "keeps_a_stand_in.py").write_text(
        "import sys\ncurrent_device = sys.modules['fake_torch_for_stand_ins'].cuda.current_device\n"
        "AT_IMPORT = current_device()\n")
    (tmp_path / "keeps_nothing.py").write_text(
        "import sys\nCAPABILITY = sys.modules['fake_torch_for_stand_ins'].cuda.get_device_capability()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("keeps_a_stand_in", "keeps_nothing"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    def answers():
        return device_facts.answered_from(torch, device_facts.nvml_facts(torch, nvml))

    kept: list[str] = []
    why = preload.import_all(["keeps_nothing"], answers=answers, kept=kept)
    assert why is None or "threads" in why  # this test process may run threads of its own
    assert sys.modules["keeps_nothing"].CAPABILITY == (9, 0) and kept == []
    why = preload.import_all(["keeps_a_stand_in"], answers=answers, kept=kept)
    assert why is None or "threads" in why
    module = sys.modules["keeps_a_stand_in"]
    assert (module.AT_IMPORT, module.current_device()) == (0, 1) and kept == ["cuda.current_device"]
    assert module.current_device.__name__ == "<lambda>" and module.current_device.__wrapped__ is torch.cuda.current_device


def test_without_nvml_the_imports_run_unchanged(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with preload.nvml_answers() as answered:
        assert answered.stand_ins == {} and answered.given == []


def test_starting_nvml_is_timed_as_the_fork_servers_own_step(monkeypatch):
    class SlowNvml(_FakeNvml):
        def nvmlInit(self):
            time.sleep(0.05)

    monkeypatch.setitem(sys.modules, "pynvml", SlowNvml())
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    with preload.nvml_answers() as answered:
        assert answered.nvml_s >= 0.05
    monkeypatch.setattr(preload, "unsafe_reason", lambda *a, **k: None)
    timings: dict[str, float] = {}
    preload.import_all([], answers=lambda: contextlib.nullcontext(device_facts.Answers(nvml_s=0.07)), timings=timings)
    assert timings["nvml_s"] == 0.07 and "nvml_s" in client.OWN_STEPS


def _write_modules(tmp_path, monkeypatch, modules: dict[str, str]) -> None:
    for name, body in modules.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_the_watch_names_the_import_that_initialised_the_driver(tmp_path, monkeypatch):
    driver = {"initialised": False}
    monkeypatch.setitem(sys.modules, "fake_driver_state", types.SimpleNamespace(state=driver))
    _write_modules(tmp_path, monkeypatch, {
        "harmless_first": "X = 1\n",
        # As sgl_kernel's compute-capability check does: the body itself initialises the driver,
        # through a function of an already imported module, and a later import is where the watch sees it.
        "initialises_driver": """\
            import sys
            def ask_the_device():
                sys.modules['fake_driver_state'].state['initialised'] = True
            ask_the_device()
            import imported_after
            """,
        "imported_after": "Y = 2\n",
        "engine_top": "import harmless_first\nimport initialises_driver\n",
    })
    with preload.DriverWatch(initialised=lambda: driver["initialised"]) as watch:
        __import__("engine_top")
    assert watch.culprit.startswith("between importing initialises_driver and importing imported_after, "
                                    "in initialises_driver:5 <- engine_top:2")


def test_the_watch_sees_imports_through_importlib(tmp_path, monkeypatch):
    import importlib

    driver = {"initialised": False}
    monkeypatch.setitem(sys.modules, "fake_driver_state", types.SimpleNamespace(state=driver))
    _write_modules(tmp_path, monkeypatch, {
        # transformers' lazy module resolves names with importlib.import_module, not `import`.
        "lazy_target": "import sys\nsys.modules['fake_driver_state'].state['initialised'] = True\n",
        "after_lazy": "Z = 3\n"})
    with preload.DriverWatch(initialised=lambda: driver["initialised"]) as watch:
        importlib.import_module("lazy_target")
        importlib.import_module("after_lazy")
    assert watch.culprit.startswith("between importing lazy_target and importing after_lazy")


def test_the_watch_says_when_the_driver_was_initialised_before_it():
    with preload.DriverWatch(initialised=lambda: True) as watch:
        pass
    assert watch.culprit == "before the fork server's imports"


def test_the_watch_is_quiet_after_its_block(tmp_path, monkeypatch):
    asked = []
    _write_modules(tmp_path, monkeypatch, {"imported_later": "W = 4\n"})
    with preload.DriverWatch(initialised=lambda: asked.append(1) or False):
        pass
    before = len(asked)
    __import__("imported_later")
    assert len(asked) == before  # a forked child pays nothing for it
    assert not any(isinstance(f, preload.DriverWatch) for f in sys.meta_path)


def test_imports_count_devices_through_nvml_and_the_switch_comes_back(tmp_path, monkeypatch):
    monkeypatch.delenv(preload.NVML_CHECK_ENV, raising=False)
    _write_modules(tmp_path, monkeypatch, {
        # torch.cuda.is_available() reads the switch at every call, as this does.
        "reads_the_switch": "import os\nSEEN = os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')\n"})
    why = preload.import_all(["reads_the_switch"], answers=lambda: contextlib.nullcontext(device_facts.Answers()))
    assert why is None or "threads" in why  # this test process may run threads of its own
    assert sys.modules["reads_the_switch"].SEEN == "1"
    assert preload.NVML_CHECK_ENV not in os.environ  # a forked child counts devices as SGLang would


def test_an_unsafe_reason_names_the_import_the_watch_saw(monkeypatch):
    class Saw(preload.DriverWatch):
        def __init__(self):
            super().__init__(initialised=lambda: False)
            self.culprit = "between importing a and importing b, in sgl_kernel:12 <- sglang.srt.layers.x:3"

    monkeypatch.setattr(preload, "unsafe_reason", lambda: "importing SGLang initialised the CUDA driver (x)")
    why = preload.import_all([], answers=lambda: contextlib.nullcontext(device_facts.Answers()), watch=Saw)
    assert why == ("importing SGLang initialised the CUDA driver (x); it happened between importing a and "
                   "importing b, in sgl_kernel:12 <- sglang.srt.layers.x:3")


def test_the_watch_names_threads_that_may_have_initialised_the_driver(tmp_path, monkeypatch):
    _write_modules(tmp_path, monkeypatch, {"imported_while_a_thread_runs": "V = 5\n"})
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="initialises-cuda-meanwhile", daemon=True)
    thread.start()
    try:
        started = []
        with preload.DriverWatch(initialised=lambda: bool(started)) as watch:
            started.append(True)  # as if the thread initialised the driver now
            __import__("imported_while_a_thread_runs")
    finally:
        release.set()
        thread.join()
    assert "other threads running: " in watch.culprit and "initialises-cuda-meanwhile" in watch.culprit


def test_the_imports_stop_where_the_driver_was_found_initialised(tmp_path, monkeypatch):
    driver = {"initialised": False}
    monkeypatch.setitem(sys.modules, "fake_driver_state", types.SimpleNamespace(state=driver))
    _write_modules(tmp_path, monkeypatch, {
        # An engine module that swallows everything its imports raise must not hide it.
        "engine_entry": """\
            import sys
            sys.modules['fake_driver_state'].state['initialised'] = True
            try:
                import never_imported
            except Exception:
                pass
            """,
        "never_imported": "import sys\nsys.modules['fake_driver_state'].state['reached'] = True\n"})
    why = preload.import_all(["engine_entry"], answers=lambda: contextlib.nullcontext(device_facts.Answers()),
                             watch=lambda: preload.DriverWatch(initialised=lambda: driver["initialised"], stop=True))
    assert why.startswith("the imports initialised the CUDA driver in the fork server; it happened between "
                          "importing engine_entry and importing never_imported, in engine_entry:4")
    assert why.endswith("(the fork server stopped importing there)")
    assert "reached" not in driver


def test_a_stand_in_kept_by_an_object_or_a_class_body_calls_torchs_own(monkeypatch, tmp_path):
    torch, nvml = _fake_torch(), _FakeNvml()
    own = types.SimpleNamespace(multi_processor_count=132)
    torch.cuda.current_device, torch.cuda.get_device_properties = (lambda: 1), (lambda device=None: own)
    monkeypatch.setitem(sys.modules, "fake_torch_for_stand_ins", torch)
    # As Triton 3.6 does when SGLang's fla kernels ask the target at import (a driver object in a
    # module-level config binds torch.cuda.current_device), and as torch's
    # _dynamo/device_interface.py does (CudaInterface binds the queries as staticmethods in its class
    # body; Inductor later asks it for the SM count, which NVML's facts lack).
    (tmp_path / "keeps_a_driver.py").write_text(textwrap.dedent("""\
        import sys
        cuda = sys.modules['fake_torch_for_stand_ins'].cuda
        class Driver:
            def __init__(self):
                self.get_current_device = cuda.current_device
        class Config:
            def __init__(self):
                self._default = Driver()
        driver = Config()
        class Interface:
            get_device_properties = staticmethod(cuda.get_device_properties)
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "keeps_a_driver", raising=False)
    torch.cuda.is_initialized = lambda: False
    monkeypatch.setitem(sys.modules, "torch", torch)

    def answers():
        return device_facts.answered_from(torch, device_facts.nvml_facts(torch, nvml))

    kept: list[str] = []
    why = preload.import_all(["keeps_a_driver"], answers=answers, kept=kept)
    assert why is None or "threads" in why
    module = sys.modules["keeps_a_driver"]
    assert module.driver._default.get_current_device() == 1
    assert module.Interface.get_device_properties(0).multi_processor_count == 132
    assert kept == ["cuda.current_device", "cuda.get_device_properties"]


def test_the_forked_line_names_the_stand_ins_the_imports_kept(caplog):
    state = client._State()
    state._status = {"safe": True, "import_s": 18.5, "checks_s": 0.01, "kept": ["cuda.current_device"],
                     "watch_s": 0.31, "watch_imports": 8123}
    with caplog.at_level(logging.INFO, logger="foundry.fork_server"):
        state.say_forked("scheduler")
    assert "checks after the imports included: 0.01 s, its driver watch over 8123 imports: 0.31 s; the imports kept " \
           "the stand-ins for torch's cuda.current_device, which now call torch's own)" in caplog.text


def test_the_status_says_what_the_driver_watch_cost_the_imports(tmp_path, monkeypatch):
    _write_modules(tmp_path, monkeypatch, {"watched_a": "import watched_b\n", "watched_b": "B = 1\n"})
    timings: dict[str, float] = {}
    preload.import_all(["watched_a"], answers=lambda: contextlib.nullcontext(device_facts.Answers()),
                       watch=lambda: preload.DriverWatch(initialised=lambda: False), timings=timings)
    assert timings["watch_imports"] == 2 and timings["watch_s"] > 0


def test_what_the_fork_server_did_before_its_imports_is_said_once(caplog):
    state = client._State()
    state.engine = "SGLang"
    state._status = {"safe": True, "import_s": 18.5, "checks_s": 0.0, "kept": [], "before": "1 files placed"}
    with caplog.at_level(logging.INFO, logger="foundry.fork_server"):
        state.say_forked("scheduler")
        state.say_forked("detokenizer")
    assert caplog.text.count("the fork server, before importing SGLang: 1 files placed") == 1


def test_a_kept_answer_makes_the_fork_server_unsafe(monkeypatch, tmp_path):
    torch, nvml = _fake_torch(), _FakeNvml()
    monkeypatch.setitem(sys.modules, "fake_torch_for_stand_ins", torch)
    # A cached helper that returns the properties object itself, asked at import; and one that
    # keeps only the numbers it read, which are NVML's true ones.
    (tmp_path / "caches_the_properties.py").write_text(textwrap.dedent("""\
        import functools, sys
        @functools.cache
        def properties():
            return sys.modules['fake_torch_for_stand_ins'].cuda.get_device_properties(0)
        properties()
        """))
    (tmp_path / "keeps_the_numbers.py").write_text(textwrap.dedent("""\
        import sys
        props = sys.modules['fake_torch_for_stand_ins'].cuda.get_device_properties(0)
        SM = props.major * 10 + props.minor
        del props
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("caches_the_properties", "keeps_the_numbers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    torch.cuda.is_initialized = lambda: False
    monkeypatch.setitem(sys.modules, "torch", torch)

    def answers():
        return device_facts.answered_from(torch, device_facts.nvml_facts(torch, nvml))

    why = preload.import_all(["keeps_the_numbers"], answers=answers)
    assert why is None or "threads" in why
    assert sys.modules["keeps_the_numbers"].SM == 90
    why = preload.import_all(["caches_the_properties"], answers=answers)
    assert why is not None and "kept an answer" in why and "get_device_properties (held by: dict)" in why


def test_each_properties_answer_is_a_copy_of_its_own():
    torch = _fake_torch()
    with device_facts.answered_from(torch, device_facts.nvml_facts(torch, _FakeNvml())) as answered:
        kept = [torch.cuda.get_device_properties(0), torch.cuda.get_device_properties(0)]
    assert kept[0] == kept[1] and kept[0] is not kept[1] and answered.given == kept
    assert device_facts.kept_answers(answered.given) == ["list"]
    kept.clear()
    assert device_facts.kept_answers(answered.given) == []


def test_without_a_device_in_nvml_the_accelerator_is_the_cpu():
    torch = _fake_torch()

    def no_device(index):
        raise LookupError(f"NVML has no device {index}")

    with device_facts.answered_from(torch, no_device):
        assert torch._C._get_accelerator().type == "cpu"


def test_a_torch_without_the_accelerator_query_keeps_the_others():
    torch = _fake_torch()
    del torch._C._get_accelerator
    with device_facts.answered_from(torch, device_facts.nvml_facts(torch, _FakeNvml())) as answered:
        assert "_C._get_accelerator" not in answered.stand_ins and torch.cuda.get_device_capability() == (9, 0)
    assert not hasattr(torch._C, "_get_accelerator")


def test_the_status_says_how_long_the_checks_after_the_imports_took(tmp_path, monkeypatch):
    (tmp_path / "imports_fine.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imports_fine", raising=False)
    monkeypatch.setattr(preload, "nvml_answers", lambda: contextlib.nullcontext(device_facts.Answers()))
    status = preload.run(modules=("imports_fine",), path=str(tmp_path / "status.json"))
    assert 0.0 <= status["checks_s"] <= status["import_s"]
    assert 0.0 <= sum(status[check] for check in preload.CHECKS) <= status["checks_s"]
    assert json.loads((tmp_path / "status.json").read_text())["checks_s"] == status["checks_s"]


def test_the_status_says_how_long_the_step_before_the_imports_took(tmp_path, monkeypatch):
    monkeypatch.setattr(preload, "nvml_answers", lambda: contextlib.nullcontext(device_facts.Answers()))
    status = preload.run(modules=("json",), path=str(tmp_path / "status.json"),
                         before=lambda: time.sleep(0.05) or "placed")
    assert status["before"] == "placed" and 0.04 <= status["before_s"] <= status["import_s"]
    assert client.own_seconds(status) == pytest.approx(status["before_s"] + status["nvml_s"] + status["watch_s"]
                                                       + status["checks_s"])


FAKE_DRIVER = r"""
static int initialised = 0, calls = 0;
int cuDeviceGetCount(int *count) { calls++; *count = 1; return initialised ? 0 : 3; }
void fake_init(void) { initialised = 1; }
int fake_calls(void) { return calls; }
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc) to build a stand-in driver library")
def test_the_driver_probe_asks_the_mapped_driver_and_keeps_its_function(tmp_path):
    import ctypes

    src, lib = tmp_path / "fake_driver.c", tmp_path / "libfakecuda.so.1"
    src.write_text(FAKE_DRIVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    probe = preload.DriverProbe(str(lib))
    assert probe() is False  # not loaded: not initialised, and nothing is loaded by asking
    driver = ctypes.CDLL(str(lib))  # an extension linked against the driver maps it
    assert probe() is False and driver.fake_calls() == 1
    driver.fake_init()
    assert probe() is True and driver.fake_calls() == 2
    kept = probe._device_count
    probe()
    assert probe._device_count is kept  # looked up once, after the driver was mapped


SCHEDULER_SEAMS = ("sglang_foundry.worker_patches", "sglang_foundry.capture_patches", "sglang_foundry.prefill_patches")


def test_the_main_process_imports_no_scheduler_seams_and_the_fork_server_imports_them_all():
    # The plugin's import in SGLang's main process is on the start's critical path; the scheduler's
    # seams are imported where a scheduler is: in the fork server before the fork (or a spawned one).
    probe = ("import sys, sglang_foundry.register, sglang_foundry.activation as a; a._install_seams_here(); "
             f"print([m for m in {SCHEDULER_SEAMS!r} + ('sglang_foundry.runtime',) if m in sys.modules])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOUNDRY_")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]", done.stderr
    from sglang_foundry import fork_server_preload

    assert set(SCHEDULER_SEAMS) <= set(fork_server_preload.MODULES)
