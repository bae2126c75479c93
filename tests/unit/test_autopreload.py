"""The start-up hook that restarts a process asking for Foundry under the preload
(foundry_core/autopreload.py, run by foundry-autopreload.pth)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
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


# ---- early starts: in the restarted process, the plugins' start-up work ------------------

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
    assert ap.run_early_starts(lambda: eps) == 1
    assert calls == ["fine"]
    assert "early start broken failed (RuntimeError: no socket)" in capsys.readouterr().err


def test_no_early_start_without_the_preload(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["m.py", "--foundry-archive", "/a"])
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert ap.run_early_starts(lambda: pytest.fail("entry points read without the preload")) == 0


def test_the_pth_file_runs_the_start_up_entry():
    pth = (Path(ap.__file__).parent / "foundry-autopreload.pth").read_text()
    assert pth.strip() == "import _foundry_autopreload; _foundry_autopreload.at_startup()"
