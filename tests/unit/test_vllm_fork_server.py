"""vllm-foundry's fork server: which commands start it, its switch, and vLLM's engine-core launch
forking from it (over a fake ``vllm.v1.engine.utils``, and end to end over a synthetic vLLM
package with multiprocessing's real fork server)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plugin_support import (early_start_installed, exec_fake_modules, fork_server_started_by_the_hook,  # noqa: E402
                            install_fake_packages)

from foundry_core.engine.fork_server import client, main_gc
from foundry_core.engine.options import env_flag
from vllm_foundry import fork_patches, patching
from vllm_foundry import fork_server as fs


@pytest.mark.parametrize("argv, expected", [
    (["python3", "/venv/bin/vllm", "serve", "Qwen/Qwen3-8B"], True),
    (["python3", "-m", "vllm.entrypoints.cli.main", "serve", "m"], True),
    (["python3", "-u", "-m", "vllm.entrypoints.cli.main", "serve"], True),
    (["python3", "-mvllm.entrypoints.cli.main", "serve"], True),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], True),
    (["python3", "/venv/bin/vllm", "bench", "serve"], False),
    (["python3", "-m", "vllm.entrypoints.cli.main", "run-batch"], False),
    (["python3", "-c", "import vllm"], False),
    (["python3", "script.py", "serve"], False),
    (["python3"], False),
])
def test_only_the_server_commands_start_a_fork_server(argv, expected):
    assert fs.starts_server(argv) is expected


@pytest.mark.parametrize("value, expected", [("", True), ("1", True), ("0", False), ("off", False), ("No", False)])
def test_the_switch(value, expected):
    assert env_flag(fs.SWITCH_ENV, environ={fs.SWITCH_ENV: value}) is expected  # what start_early asks


@pytest.mark.parametrize("variable", [fs.SWITCH_ENV, fs.INPROC_ENV])
def test_switched_off_or_with_the_engine_in_the_api_server_nothing_starts(monkeypatch, variable):
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 runs the engine in the API server: no fork server, and the
    start-up hook restarts it under the preload (start_early says it hosts nothing)."""
    monkeypatch.delenv(fs.SWITCH_ENV, raising=False)
    monkeypatch.setenv(variable, "0")
    monkeypatch.setattr(sys, "orig_argv", ["python3", "/venv/bin/vllm", "serve", "m"])
    monkeypatch.setattr(fs, "start", lambda *a, **k: pytest.fail("the fork server started"))
    assert fs.start_early() is False


@pytest.mark.parametrize("value, argv, expected", [
    (None, [], True), ("1", [], True), ("0", [], False), ("00", [], False), ("2", [], True),
    (None, ["serve", "m", "--distributed-executor-backend", "external_launcher"], False),
    (None, ["serve", "m", "--distributed-executor-backend=external_launcher"], False),
    (None, ["serve", "m", "--distributed-executor-backend", "mp"], True),
])
def test_the_engine_runs_in_children_as_vllm_decides_it(value, argv, expected):
    environ = {} if value is None else {fs.INPROC_ENV: value}
    assert fs.engine_in_children(environ, argv) is expected


def test_a_started_fork_server_hosts_the_engine_core(monkeypatch):
    monkeypatch.delenv(fs.SWITCH_ENV, raising=False)
    monkeypatch.delenv(fs.INPROC_ENV, raising=False)
    monkeypatch.setattr(sys, "orig_argv", ["python3", "/venv/bin/vllm", "serve", "m"])
    started = []
    monkeypatch.setattr(fs, "start", lambda *a, **k: started.append(1) or "/tmp/status.json")
    assert fs.start_early() is True and started == [1]  # the API server is not restarted
    monkeypatch.setattr(sys, "orig_argv", ["python3", "script.py"])
    assert fs.start_early() is False and started == [1]


def test_a_failing_start_is_reported_and_swallowed(monkeypatch, capsys):
    monkeypatch.delenv(fs.SWITCH_ENV, raising=False)
    monkeypatch.setattr(sys, "orig_argv", ["python3", "/venv/bin/vllm", "serve", "m"])

    def broken(*_a, **_k):
        raise OSError("no socket")

    monkeypatch.setattr(fs, "start", broken)
    assert fs.start_early() is False  # restarted under the preload; the engine core is spawned
    assert "vLLM fork server did not start (OSError: no socket); vLLM's engine core will be spawned" \
        in capsys.readouterr().err


# ---- the engine-core launch ------------------------------------------------------------------

FAKE_LAUNCH = {
    "vllm.utils.system_utils": """
        import multiprocessing

        def get_mp_context():
            return multiprocessing.get_context("spawn")
    """,
    "vllm.v1.engine.core": """
        class EngineCoreProc:
            @staticmethod
            def run_engine_core(*args, dp_rank=0, local_dp_rank=0, **kwargs):
                pass
    """,
    "vllm.v1.engine.utils": """
        from vllm.utils.system_utils import get_mp_context

        class CoreEngineProcManager:
            def __init__(self, local_engine_count, start_index=0):
                from vllm.v1.engine.core import EngineCoreProc

                context = get_mp_context()
                self.context = context
                self.processes = [context.Process(target=EngineCoreProc.run_engine_core, name="EngineCore")
                                  for _ in range(local_engine_count)]
    """,
}


@pytest.fixture
def fake_launch(monkeypatch):
    install_fake_packages(monkeypatch, FAKE_LAUNCH)
    mods = exec_fake_modules(monkeypatch, FAKE_LAUNCH)
    monkeypatch.setattr(patching, "vllm_version", lambda: "0.0.fake")
    yield mods["vllm.v1.engine.utils"]
    patching.uninstall_all()


@pytest.mark.parametrize("server_running", [True, False])
def test_the_engine_core_is_forked_only_with_a_fork_server(fake_launch, monkeypatch, server_running):
    state = client._State()
    if server_running:
        state.started("/nonexistent/status.json", os.environ.get("LD_PRELOAD", ""), "vLLM", fs.CHILD_NAMES)
    monkeypatch.setattr(client, "_STATE", state)
    assert fork_patches.install() is server_running
    plain = fake_launch.get_mp_context
    manager = fake_launch.CoreEngineProcManager(2)
    assert all(isinstance(p, client.ForkedProcess) for p in manager.processes) is server_running
    assert isinstance(manager.context, client.ForkingMultiprocessing) is server_running
    assert fake_launch.get_mp_context is plain  # only for the call
    assert manager.context.get_start_method() == "spawn"  # everything else is the context's own
    if server_running:
        assert state.describe(manager.processes[0]._target) == "engine core"


def test_a_vllm_without_the_launch_seams_spawns_its_engine_core(fake_launch, monkeypatch, caplog):
    state = client._State()
    state.started("/nonexistent/status.json", os.environ.get("LD_PRELOAD", ""), "vLLM", fs.CHILD_NAMES)
    monkeypatch.setattr(client, "_STATE", state)
    monkeypatch.delattr(fake_launch, "get_mp_context")
    assert fork_patches.install() is False
    assert "engine core is spawned, not forked from the fork server" in caplog.text
    assert "get_mp_context" in caplog.text


def test_a_vllm_that_will_spawn_its_engine_core_ends_the_main_processs_collector_pause(fake_launch, monkeypatch):
    state = client._State()
    state.started("/nonexistent/status.json", os.environ.get("LD_PRELOAD", ""), "vLLM", fs.CHILD_NAMES)
    monkeypatch.setattr(client, "_STATE", state)
    monkeypatch.delattr(fake_launch, "get_mp_context")
    main_gc.pause()  # as the early start paused it: no launch through the fork server would end it
    try:
        assert fork_patches.install() is False
        assert gc.isenabled() and not main_gc.paused()
    finally:
        gc.unfreeze()


# ---- end to end: multiprocessing's fork server over a synthetic vLLM -------------------------

ENGINE_CORE = """
import json, os
IMPORTED_IN = os.getpid()

class EngineCoreProc:
    @staticmethod
    def run_engine_core(*args, dp_rank=0, local_dp_rank=0, out=None, **kwargs):
        with open(out, "w") as f:
            json.dump({"pid": os.getpid(), "ppid": os.getppid(), "imported_in": IMPORTED_IN,
                       "mark": os.environ.get("MARK"), "status_env": os.environ.get("%s")}, f)
"""

ENGINE_UTILS = """
from vllm.utils.system_utils import get_mp_context

class CoreEngineProcManager:
    def __init__(self, local_engine_count, out):
        from vllm.v1.engine.core import EngineCoreProc

        context = get_mp_context()
        self.processes = [context.Process(target=EngineCoreProc.run_engine_core, name="EngineCore",
                                          kwargs={"out": out}) for _ in range(local_engine_count)]
        for p in self.processes:
            p.start()
"""

DRIVER = """
import json, logging, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the synthetic vllm: not on PYTHONPATH
from foundry_core.engine.fork_server import client
from vllm_foundry import fork_patches, fork_server

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    fork_server.start()
    fork_patches.install()
    os.environ["MARK"] = "set after the fork server started"
    out = sys.argv[1]
    from vllm.v1.engine.utils import CoreEngineProcManager

    p = CoreEngineProcManager(1, out).processes[0]
    p.join(60)
    child = json.load(open(out))
    child.update(main=os.getpid(), exitcode=p.exitcode, status=client._STATE.status())
    print(json.dumps(child))
"""


def _synthetic_vllm(root: Path) -> None:
    """A vllm package with the modules the fork server imports and the engine-core launch."""
    files = {
        "vllm/utils/system_utils.py": "import multiprocessing\n\n"
                                      "def get_mp_context():\n    return multiprocessing.get_context('spawn')\n",
        "vllm/v1/engine/core.py": ENGINE_CORE % client.STATUS_ENV,
        "vllm/v1/engine/utils.py": ENGINE_UTILS,
        "vllm/v1/executor/uniproc_executor.py": "",
        "vllm/v1/worker/gpu_worker.py": "",
        "vllm/v1/worker/gpu_model_runner.py": "",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        for d in path.relative_to(root).parents:
            if str(d) != ".":
                (root / d / "__init__.py").touch()


def test_the_engine_core_is_forked_from_a_server_that_imported_vllm(tmp_path):
    _synthetic_vllm(tmp_path)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    # The synthetic package is on the driver's sys.path alone: the fork server gets it from there.
    proc = subprocess.run([sys.executable, str(driver), str(tmp_path / "child.json")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "vLLM's engine core is forked from the fork server (which imported vLLM in" in proc.stderr
    assert child["exitcode"] == 0 and child["status"]["safe"] is True, child
    assert child["imported_in"] != child["pid"]  # the engine core module was imported before the fork
    assert child["ppid"] != child["main"]  # its parent is the fork server
    assert child["mark"] == "set after the fork server started"  # the API server's environment at start()
    assert child["status_env"] is None  # the fork server's own variables stay there


@pytest.mark.skipif(not early_start_installed("vllm"), reason="needs foundry-core's start-up hook and vllm-foundry's "
                    "entry point installed (`pip install -e . -e plugins/vllm_foundry`)")
@pytest.mark.parametrize("env, running", [({}, True), ({fs.SWITCH_ENV: "0"}, False), ({"FOUNDRY_MODE": "off"}, False),
                                          ({fs.INPROC_ENV: "0"}, False)])
@pytest.mark.parametrize("preloaded", [False, True])
def test_the_start_up_hook_starts_the_fork_server_for_vllm_serve(tmp_path, env, running, preloaded):
    assert fork_server_started_by_the_hook(tmp_path, "vllm.entrypoints.cli.main", ["serve", "m"], env, preloaded) is running
