"""The command line on a machine with or without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from foundry_core import cli
from foundry_core.preload import preload_environment, preload_path

FOUNDRY = [sys.executable, "-m", "foundry_core.cli"]


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*FOUNDRY, *args], capture_output=True, text=True, timeout=120, **kw)


def test_help_lists_commands():
    out = run("--help")
    assert out.returncode == 0
    for cmd in ("run", "preload-path", "doctor", "demo", "bench", "ready", "inspect", "verify", "diff"):
        assert cmd in out.stdout


def test_unknown_command_is_an_error():
    out = run("frobnicate")
    assert out.returncode == 2
    assert "invalid choice" in out.stderr


def test_preload_path_points_at_the_library():
    out = run("preload-path")
    assert out.returncode == 0
    path = out.stdout.strip()
    assert path.endswith("libfoundry.so") and os.path.isfile(path)


def test_doctor_runs_and_reports_each_check():
    out = run("doctor")
    assert out.returncode == 0, out.stderr
    for name in ("library", "preload", "driver"):
        assert name in out.stdout


def test_doctor_says_no_gpu_without_a_driver():
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    out = run("doctor")
    assert "no GPU" in out.stdout


def test_run_true_succeeds_under_the_preload():
    out = run("run", "--", "true")
    assert out.returncode == 0, out.stderr


def test_run_passes_the_exit_status_and_sets_the_preload():
    out = run("run", "--", sys.executable, "-c",
              "import os, sys; sys.exit(0 if 'libfoundry.so' in os.environ['LD_PRELOAD'] else 3)")
    assert out.returncode == 0, out.stderr
    out = run("run", "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert out.returncode == 7


def test_run_without_a_command_explains():
    out = run("run")
    assert out.returncode == 2
    assert "give the command" in out.stderr


def test_run_of_a_missing_command_says_so():
    out = run("run", "--", "no-such-command-xyz")
    assert out.returncode == 127
    assert "command not found" in out.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_a_compiler_runs_under_the_preload(tmp_path):
    src = tmp_path / "hello.c"
    src.write_text('#include <stdio.h>\nint main(void){puts("hello");return 0;}\n')
    exe = tmp_path / "hello"
    out = run("run", "--", "cc", "-O1", str(src), "-o", str(exe))
    assert out.returncode == 0, out.stderr
    assert subprocess.run([str(exe)], capture_output=True, text=True, env=preload_environment()).stdout == "hello\n"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_rtld_next_stays_relative_to_the_caller(tmp_path):
    # A library that wraps puts() and finds the real one with dlsym(RTLD_NEXT): with a dlsym
    # interposer that broke caller-relative lookup, it would find itself and recurse forever.
    lib = tmp_path / "libwrap.c"
    lib.write_text(
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <stdio.h>\n"
        "int puts(const char* s){ int (*real)(const char*) = (int(*)(const char*))dlsym(RTLD_NEXT, \"puts\");"
        " if (real == puts) return -99; fputs(\"wrapped:\", stdout); return real(s); }\n")
    main = tmp_path / "main.c"
    main.write_text("#include <stdio.h>\nint main(void){ return puts(\"x\") == -99 ? 5 : 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(lib), "-o", str(tmp_path / "libwrap.so"), "-ldl"], check=True)
    subprocess.run(["cc", str(main), "-o", str(tmp_path / "main"), f"-L{tmp_path}", "-lwrap",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    out = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, env=preload_environment(),
                         timeout=30)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    assert out.stdout == "wrapped:x\n"


def test_preload_environment_is_idempotent():
    env = preload_environment({"LD_PRELOAD": "/other/lib.so"})
    again = preload_environment(env)
    assert again["LD_PRELOAD"].split().count(preload_path()) == 1
    assert "/other/lib.so" in again["LD_PRELOAD"]


def test_main_returns_the_subcommand_status(capsys):
    assert cli.main(["preload-path"]) == 0
    assert capsys.readouterr().out.strip() == preload_path()


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_demo_and_bench_without_a_gpu_say_what_they_need(command):
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    out = run(command)
    assert out.returncode == 1
    assert f"foundry {command} needs an NVIDIA GPU" in out.stdout, out.stdout + out.stderr
