"""foundry_core.engine.environment: the environment of an engine's child processes, preload checks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

import foundry_core.preload
from foundry_core import _native
from foundry_core.engine import environment
from foundry_core.engine.environment import (
    REEXEC_MARKER,
    REQUIRED_SETTINGS,
    ensure_preloaded_or_reexec,
    preload_active,
    prepare_child_environment,
)
from foundry_core.engine.mode import Mode
from foundry_core.errors import StateError

LIB = "/opt/foundry/lib/libfoundry.so"


@pytest.fixture(autouse=True)
def fake_library(monkeypatch):
    # preload_environment() asks preload_path() for the library; no build is needed here.
    monkeypatch.setattr(foundry_core.preload, "preload_path", lambda: LIB)
    for key in [k for k in os.environ if k.startswith("FOUNDRY_")]:
        monkeypatch.delenv(key)


def test_sets_preload_and_the_required_variables():
    env = prepare_child_environment({"PATH": "/bin"})
    assert env["LD_PRELOAD"] == LIB
    for key, value in REQUIRED_SETTINGS.items():
        assert env[key] == value
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_CUMEM_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["PATH"] == "/bin"


def test_idempotent():
    once = prepare_child_environment({"LD_PRELOAD": "/usr/lib/libnvshmem_host.so", "PATH": "/bin"}, archive="/a",
                                     mode=Mode.LOAD)
    assert prepare_child_environment(once) == once
    assert prepare_child_environment(prepare_child_environment(once)) == once


def test_keeps_other_preloads_and_puts_foundry_first():
    env = prepare_child_environment({"LD_PRELOAD": "/usr/lib/libnvshmem_host.so"})
    assert env["LD_PRELOAD"].split() == [LIB, "/usr/lib/libnvshmem_host.so"]


def test_does_not_modify_its_input():
    base = {"NCCL_CUMEM_ENABLE": "1"}
    prepare_child_environment(base)
    assert base == {"NCCL_CUMEM_ENABLE": "1"}


def test_overrides_conflicting_user_settings_with_a_warning(caplog):
    env = prepare_child_environment({"NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "0"})
    assert env["NCCL_CUMEM_ENABLE"] == "0"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NCCL_CUMEM_ENABLE=1" in warnings[0]


def test_propagates_foundry_variables_without_overriding(monkeypatch):
    monkeypatch.setenv("FOUNDRY_LOG", "debug")
    monkeypatch.setenv("FOUNDRY_STRICT", "1")
    monkeypatch.setenv(REEXEC_MARKER, "1")
    env = prepare_child_environment({"FOUNDRY_STRICT": "0"})
    assert env["FOUNDRY_LOG"] == "debug"
    assert env["FOUNDRY_STRICT"] == "0"
    assert REEXEC_MARKER not in env


def test_settings_for_children():
    env = prepare_child_environment({}, archive="/srv/archives/qwen", mode="Save")
    assert env["FOUNDRY_ARCHIVE"] == "/srv/archives/qwen" and env["FOUNDRY_MODE"] == "save"


def test_defaults_to_this_process_environment(monkeypatch):
    monkeypatch.setenv("SOME_ENGINE_VAR", "x")
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    env = prepare_child_environment()
    assert env["SOME_ENGINE_VAR"] == "x" and env["LD_PRELOAD"].startswith(LIB)
    assert "NCCL_NVLS_ENABLE" not in os.environ  # a copy: this process is left as it is


# ---- preload checks -------------------------------------------------------------------------------

class FakeLib:
    def __init__(self, active: int) -> None:
        self.active = active

    def foundry_preload_active(self) -> int:
        return self.active


def test_preload_active_reports_the_native_answer(monkeypatch):
    monkeypatch.setattr(_native, "lib", lambda: FakeLib(1))
    assert preload_active() is True
    monkeypatch.setattr(_native, "lib", lambda: FakeLib(0))
    assert preload_active() is False


@pytest.mark.parametrize("error", [OSError("libfoundry.so: cannot open shared object file"),
                                   FileNotFoundError("libfoundry.so not found"), ImportError("too old")])
def test_preload_active_is_false_when_the_library_cannot_load(monkeypatch, error):
    def fail():
        raise error

    monkeypatch.setattr(_native, "lib", fail)
    assert preload_active() is False


@pytest.fixture
def execs(monkeypatch):
    calls = []

    def fake_execve(path, args, env):
        calls.append((path, args, env))
        raise SystemExit("exec")

    monkeypatch.setattr(os, "execve", fake_execve)
    return calls


def test_ensure_reports_without_reexec(monkeypatch, execs):
    monkeypatch.setattr(environment, "preload_active", lambda: True)
    assert ensure_preloaded_or_reexec() is True
    monkeypatch.setattr(environment, "preload_active", lambda: False)
    assert ensure_preloaded_or_reexec() is False
    assert execs == []


def test_ensure_reexecs_under_the_prepared_environment(monkeypatch, execs):
    monkeypatch.setattr(environment, "preload_active", lambda: False)
    with pytest.raises(SystemExit):
        ensure_preloaded_or_reexec(["serve.py", "--port", "8000"], reexec=True)
    path, args, env = execs[0]
    assert path == sys.executable and args == [sys.executable, "serve.py", "--port", "8000"]
    assert env["LD_PRELOAD"].startswith(LIB) and env[REEXEC_MARKER] == "1" and env["NCCL_CUMEM_ENABLE"] == "0"


def test_ensure_reexec_keeps_the_interpreter_options_by_default(monkeypatch, execs):
    monkeypatch.setattr(environment, "preload_active", lambda: False)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "engine.serve", "--x"])
    with pytest.raises(SystemExit):
        ensure_preloaded_or_reexec(reexec=True)
    assert execs[0][1] == [sys.executable, "-m", "engine.serve", "--x"]


def test_ensure_does_not_loop(monkeypatch, execs):
    monkeypatch.setattr(environment, "preload_active", lambda: False)
    monkeypatch.setenv(REEXEC_MARKER, "1")
    with pytest.raises(StateError, match="still not active"):
        ensure_preloaded_or_reexec(reexec=True)
    assert execs == []


NATIVE_PROBE = """
import ctypes, json, os, sys
from foundry_core import _library
if sys.argv[1] == "set":
    os.environ["LD_PRELOAD"] = str(_library.library_path())  # for children only
elif sys.argv[1] == "drop":
    os.environ.pop("LD_PRELOAD", None)  # dropped after the exec
else:  # what setproctitle does: the exec-time environment block (/proc/self/environ) written over
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    start, end = int(fields[-3]), int(fields[-2])  # env_start, env_end (proc(5))
    ctypes.memset(start, 0, end - start)
print(json.dumps(bool(_library.load().foundry_preload_active())))
"""


@pytest.mark.parametrize("preloaded, live", [(False, "set"), (True, "drop"), (True, "overwritten")])
def test_the_native_answer_is_the_exec_time_preload_not_the_environment(tmp_path, preloaded, live):
    """A process that puts libfoundry.so in its own LD_PRELOAD (for its children) is not
    preloaded; one exec'ed with it stays preloaded when it drops the variable, or when its
    exec-time environment block is written over (setproctitle, which vLLM's processes call)."""
    from foundry_core import _library

    try:
        lib = str(_library.library_path())
    except FileNotFoundError as exc:
        pytest.skip(f"libfoundry.so is not built here ({exc})")
    script = tmp_path / "probe.py"
    script.write_text(NATIVE_PROBE)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("FOUNDRY_")}
    env["FOUNDRY_AUTOPRELOAD"] = "0"
    if preloaded:
        env["LD_PRELOAD"] = lib
    out = subprocess.run([sys.executable, str(script), live], env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) is preloaded
