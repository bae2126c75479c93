"""The start-up hook that restarts a process asking for Foundry under the preload
(foundry_core/autopreload.py, run by foundry-autopreload.pth)."""

from __future__ import annotations

import importlib.util
import json
import os
import builtins
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foundry_core import autopreload as ap


@pytest.mark.parametrize("argv, value", [
    (["serve", "m", "--foundry-archive", "/a"], "/a"),
    (["serve", "--foundry-archive=/b", "m"], "/b"),
    (["serve", "--foundry-archive", "/a", "--foundry-archive=/c"], "/c"),
    (["serve", "--foundry-archive"], ""),
    (["serve", "--foundry-archived", "/a"], None),
    (["serve", "m"], None),
])
def test_flag_value(argv, value):
    assert ap.flag_value(argv, "--foundry-archive") == value


@pytest.mark.parametrize("argv, env, wanted", [
    (["x", "--foundry-archive", "/a"], {}, True),
    (["x"], {"FOUNDRY_ARCHIVE": "/a"}, True),
    (["x"], {"FOUNDRY_ARCHIVE": "  "}, False),
    (["x"], {}, False),
    (["x", "--foundry-archive", "/a", "--foundry-mode", "off"], {}, False),
    (["x", "--foundry-archive", "/a", "--foundry-mode=OFF"], {}, False),
    (["x"], {"FOUNDRY_ARCHIVE": "/a", "FOUNDRY_MODE": "off"}, False),
    (["x", "--foundry-mode", "load"], {"FOUNDRY_ARCHIVE": "/a", "FOUNDRY_MODE": "off"}, True),  # the flag wins
])
def test_wants_foundry(argv, env, wanted):
    assert ap.wants_foundry(argv, env) is wanted


def test_preloaded_looks_for_the_library_by_name():
    assert ap.preloaded({"LD_PRELOAD": "/usr/lib/libother.so /opt/x/libfoundry.so"})
    assert ap.preloaded({"LD_PRELOAD": "/opt/x/libfoundry.so:/usr/lib/libother.so"})
    assert not ap.preloaded({"LD_PRELOAD": "/opt/x/libfoundry.so.bak"})
    assert not ap.preloaded({})


def test_should_restart_respects_the_switch_and_the_guard():
    argv = ["x", "--foundry-archive", "/a"]
    assert ap.should_restart(argv, {})
    assert not ap.should_restart(argv, {"FOUNDRY_AUTOPRELOAD": "0"})
    assert not ap.should_restart(argv, {"FOUNDRY_AUTOPRELOAD": "off"})
    assert not ap.should_restart(argv, {"FOUNDRY_AUTOPRELOAD_RESTARTED": "1"})
    assert not ap.should_restart(argv, {"LD_PRELOAD": "/x/libfoundry.so"})


def test_maybe_reexec_replays_the_command_under_the_preload(monkeypatch):
    calls = []
    monkeypatch.setattr(sys, "argv", ["app.py", "--foundry-archive", "/a"])
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "dev", "app.py", "--foundry-archive", "/a"], raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("FOUNDRY_AUTOPRELOAD", raising=False)
    monkeypatch.delenv("FOUNDRY_AUTOPRELOAD_RESTARTED", raising=False)
    monkeypatch.delenv("FOUNDRY_MODE", raising=False)
    monkeypatch.setattr("foundry_core.preload.preload_path", lambda: "/opt/foundry/libfoundry.so")
    assert ap.maybe_reexec(lambda path, args, env: calls.append((path, args, env)))
    path, args, env = calls[0]
    assert path == sys.executable and args == [sys.executable, "-X", "dev", "app.py", "--foundry-archive", "/a"]
    assert env["LD_PRELOAD"].split()[0] == "/opt/foundry/libfoundry.so"
    assert env["FOUNDRY_AUTOPRELOAD_RESTARTED"] == "1"


def test_maybe_reexec_leaves_unreplayable_and_failing_starts_alone(monkeypatch, capsys):
    calls = []
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("FOUNDRY_AUTOPRELOAD", raising=False)
    monkeypatch.delenv("FOUNDRY_AUTOPRELOAD_RESTARTED", raising=False)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", "/a")
    monkeypatch.setattr(sys, "argv", ["-"])  # a script read from stdin cannot be read twice
    assert not ap.maybe_reexec(lambda *a: calls.append(a))
    monkeypatch.setattr(sys, "argv", ["app.py"])

    def missing_library():
        raise FileNotFoundError("libfoundry.so not found")

    monkeypatch.setattr("foundry_core.preload.preload_path", missing_library)
    assert not ap.maybe_reexec(lambda *a: calls.append(a))  # start-up goes on without the preload
    assert calls == []
    err = capsys.readouterr().err
    assert "cannot be replayed" in err and "FileNotFoundError: libfoundry.so not found" in err


PROBE = """
import json, os
from foundry_core.engine import preload_active
print(json.dumps({"restarted": os.environ.get("FOUNDRY_AUTOPRELOAD_RESTARTED"), "active": preload_active()}))
"""


@pytest.mark.skipif(importlib.util.find_spec("_foundry_autopreload") is None,
                    reason="the start-up hook is installed by `pip install -e .` (foundry-autopreload.pth); "
                           "this interpreter's site-packages has none")
@pytest.mark.parametrize("extra, env, restarted", [
    (["--foundry-archive", "/tmp/none"], {}, True),
    (["--foundry-archive", "/tmp/none", "--foundry-mode", "off"], {}, False),
    ([], {}, False),
    (["--foundry-archive", "/tmp/none"], {"FOUNDRY_AUTOPRELOAD": "0"}, False),
])
def test_installed_hook_restarts_a_real_interpreter(tmp_path, extra, env, restarted):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    base = {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "FOUNDRY_ARCHIVE", "FOUNDRY_MODE", "FOUNDRY_AUTOPRELOAD",
                         "FOUNDRY_AUTOPRELOAD_RESTARTED")}
    out = subprocess.run([sys.executable, str(script), *extra], env={**base, **env}, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["restarted"] == "1") is restarted
    assert result["active"] is restarted  # restarted processes run with libfoundry.so preloaded


HOSTING_PLUGIN = """
import json, os
def start():
    with open(os.environ["PROBE_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "ld_preload": os.environ.get("LD_PRELOAD", "")}) + "\\n")
    return os.environ.get("PROBE_HOSTS") == "1"
"""


def _probe_plugin(tmp_path: Path, hosts: bool) -> tuple[dict[str, str], Path]:
    """A site directory with a plugin whose early start logs each call (to the returned file) and
    returns ``hosts``; the environment that puts it on the path, without Foundry's variables."""
    site = tmp_path / "site"
    (site / "probe_plugin-0.dist-info").mkdir(parents=True)
    (site / "probe_plugin-0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-plugin\nVersion: 0\n")
    (site / "probe_plugin-0.dist-info" / "entry_points.txt").write_text("[foundry.early_start]\nprobe = probe_plugin:start\n")
    (site / "probe_plugin.py").write_text(HOSTING_PLUGIN)
    log = tmp_path / "early.jsonl"
    base = {k: v for k, v in os.environ.items() if not k.startswith("FOUNDRY_") and k != "LD_PRELOAD"}
    return {**base, "PYTHONPATH": str(site), "PROBE_LOG": str(log), "PROBE_HOSTS": "1" if hosts else "0"}, log


@pytest.mark.skipif(importlib.util.find_spec("_foundry_autopreload") is None,
                    reason="the start-up hook is installed by `pip install -e .` (foundry-autopreload.pth); "
                           "this interpreter's site-packages has none")
@pytest.mark.parametrize("hosts", [True, False])
def test_installed_hook_restarts_only_when_no_early_start_hosts_the_gpu_processes(tmp_path, hosts):
    """A real interpreter with a plugin's early start on its path: one that hosts the GPU
    processes leaves the process unrestarted, with the preload in its environment for them; one
    that does not is run once, before the restart."""
    env, log = _probe_plugin(tmp_path, hosts)
    script = tmp_path / "probe.py"
    script.write_text(PROBE.replace('"active": preload_active()',
                                    '"active": preload_active(), "ld_preload": os.environ.get("LD_PRELOAD", "")'))
    out = subprocess.run([sys.executable, str(script), "--foundry-archive", "/tmp/none"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1  # never again in a restarted process
    assert "libfoundry.so" in calls[0]["ld_preload"]  # what a fork server started there inherits
    assert (result["restarted"] == "1") is not hosts
    assert result["active"] is not hosts  # the hosting process itself runs without the preload
    assert "libfoundry.so" in result["ld_preload"]  # its children exec with it either way


@pytest.mark.skipif(importlib.util.find_spec("_foundry_autopreload") is None,
                    reason="the start-up hook is installed by `pip install -e .` (foundry-autopreload.pth); "
                           "this interpreter's site-packages has none")
def test_the_children_of_a_restarted_process_run_their_early_starts(tmp_path):
    """``foundry run -- vllm serve ... --foundry-archive DIR``: the launcher, asking for Foundry
    too, is restarted; the server it starts is another process and runs its early starts."""
    env, log = _probe_plugin(tmp_path, hosts=False)
    launcher = tmp_path / "launcher.py"
    launcher.write_text("import subprocess, sys\n"
                        "subprocess.run([sys.executable, '-c', 'pass', '--foundry-archive', '/tmp/none'], check=True)\n"
                        "subprocess.run([sys.executable, sys.argv[1], '--foundry-archive', '/tmp/none'], check=True)\n")
    server = tmp_path / "server.py"
    server.write_text("")
    subprocess.run([sys.executable, str(launcher), str(server), "--foundry-archive", "/tmp/none"], env=env,
                   capture_output=True, text=True, timeout=120, check=True)
    pids = [json.loads(line)["pid"] for line in log.read_text().splitlines()]
    assert len(pids) == 2 and pids[0] != pids[1]  # the launcher once (before its restart), the server once


# ---- early starts: the plugins' start-up work ------------------

PRELOADED = {"LD_PRELOAD": "/site/foundry_core/libfoundry.so", "FOUNDRY_ARCHIVE": "/a"}


@pytest.mark.parametrize("argv, env, wanted", [
    (["m.py"], PRELOADED, True),
    (["m.py", "--foundry-archive", "/a"], {"LD_PRELOAD": "/x/libfoundry.so"}, True),
    (["m.py"], {"FOUNDRY_ARCHIVE": "/a"}, False),  # not restarted yet: the restarted process does it
    (["m.py"], {"LD_PRELOAD": "/x/libfoundry.so"}, False),  # Foundry not asked for
    (["m.py"], {**PRELOADED, "FOUNDRY_MODE": "off"}, False),
    (["m.py"], {**PRELOADED, "FOUNDRY_EARLY_START": "0"}, False),
    (["-c"], PRELOADED, False),  # a multiprocessing child (spawn's, the fork server's)
])
def test_when_early_starts_run(argv, env, wanted):
    assert ap.wants_early_starts(argv, env) is wanted


class _EntryPoint:
    def __init__(self, name, fn):
        self.name, self._fn = name, fn

    def load(self):
        return self._fn


def test_early_starts_run_each_plugin_and_survive_a_failing_one(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["m.py"])
    for k, v in PRELOADED.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("FOUNDRY_MODE", raising=False)
    monkeypatch.delenv("FOUNDRY_EARLY_START", raising=False)
    calls = []

    def broken():
        raise RuntimeError("no socket")

    eps = [_EntryPoint("broken", broken), _EntryPoint("fine", lambda: calls.append("fine"))]
    assert ap.run_early_starts(lambda: eps) == (1, False)
    assert calls == ["fine"]
    assert "early start broken failed (RuntimeError: no socket)" in capsys.readouterr().err


def test_no_early_start_without_the_preload(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["m.py", "--foundry-archive", "/a"])
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert ap.run_early_starts(lambda: pytest.fail("entry points read without the preload")) == (0, False)


def _asking_for_foundry(monkeypatch, ld_preload=None):
    monkeypatch.setattr(sys, "argv", ["m.py", "--foundry-archive", "/a"])
    for name in ("FOUNDRY_MODE", "FOUNDRY_EARLY_START", "FOUNDRY_AUTOPRELOAD_RESTARTED", "FOUNDRY_ARCHIVE"):
        monkeypatch.delenv(name, raising=False)
    # setenv first, so that what the hook puts in LD_PRELOAD is undone after the test even where
    # the variable was unset (delenv of an unset variable records nothing to restore).
    monkeypatch.setenv("LD_PRELOAD", ld_preload or "")
    if ld_preload is None:
        monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr("foundry_core.preload.preload_path", lambda: "/opt/foundry/libfoundry.so")


def test_an_early_start_that_hosts_the_gpu_processes_leaves_the_preload_to_the_children(monkeypatch):
    _asking_for_foundry(monkeypatch, ld_preload="/usr/lib/libother.so")
    seen = []

    def fork_server():
        seen.append(os.environ["LD_PRELOAD"])  # what the fork server it starts inherits
        return True

    assert ap.children_take_the_preload(lambda: [_EntryPoint("none", lambda: None), _EntryPoint("fs", fork_server)])
    assert seen == ["/opt/foundry/libfoundry.so /usr/lib/libother.so"]
    assert os.environ["LD_PRELOAD"] == seen[0]  # for every later child: spawned ones exec with it


@pytest.mark.parametrize("answer", [None, False, 1, "yes"])
def test_early_starts_that_host_nothing_leave_the_environment_to_the_restart(monkeypatch, answer):
    _asking_for_foundry(monkeypatch)
    calls = []
    assert not ap.children_take_the_preload(lambda: [_EntryPoint("p", lambda: calls.append(1) or answer)])
    assert calls == [1] and "LD_PRELOAD" not in os.environ
    # The restarted process (the same pid) does not run them again; its children do.
    restarted = {"LD_PRELOAD": "/opt/foundry/libfoundry.so", "FOUNDRY_AUTOPRELOAD_RESTARTED": "1"}
    assert not ap.wants_early_starts(sys.argv, {**restarted, ap.EARLY_STARTS_RAN_ENV: str(os.getpid())})
    assert ap.wants_early_starts(sys.argv, {**restarted, ap.EARLY_STARTS_RAN_ENV: str(os.getpid() + 1)})


def test_at_startup_restarts_only_when_no_early_start_hosts(monkeypatch):
    _asking_for_foundry(monkeypatch)
    hosted, restarts = [], []
    monkeypatch.setattr(ap, "children_take_the_preload", lambda: bool(hosted))
    monkeypatch.setattr(ap, "maybe_reexec", lambda decided=None, early_starts_ran=False: restarts.append(decided))
    ap.at_startup()
    assert len(restarts) == 1 and abs(restarts[0] - time.time()) < 60  # the restart is timed from the hook
    hosted.append(True)
    ap.at_startup()
    assert len(restarts) == 1


def test_the_pth_file_runs_the_start_up_entry():
    pth = (Path(ap.__file__).parent / "foundry-autopreload.pth").read_text()
    assert pth.strip() == "import _foundry_autopreload; _foundry_autopreload.at_startup()"


def test_the_engine_modules_imported_ahead_are_timed_apart(monkeypatch):
    _asking_for_foundry(monkeypatch)
    monkeypatch.setattr(ap, "startup_seconds", {})
    monkeypatch.setattr(ap, "startup_pid", None)
    monkeypatch.setattr(ap, "ENGINE_MODULES", ("_foundry_probe_module",))
    imported = []

    real_import = builtins.__import__

    def slow_import(name, *args, **kwargs):
        if name == "_foundry_probe_module":
            time.sleep(0.05)
            imported.append(name)
            return sys
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", slow_import)

    def early():
        time.sleep(0.02)
        return True

    assert ap.children_take_the_preload(lambda: [_EntryPoint("fs", early)])
    assert imported == ["_foundry_probe_module"]
    assert ap.startup_seconds[ap.ENGINE_WORK] >= 0.05
    assert 0.02 <= ap.startup_seconds["early start"] < 0.05  # the engine's import is not in it
