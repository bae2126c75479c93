"""`foundry ready`'s kinds of start: their commands and environments, the run's order, and the
command line that builds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from foundry_core import cli
from foundry_core.ready import caches, engines, harness, kinds

HOST = {"HOME": "/home/u", "USER": "u", "PATH": "/usr/bin"}


def _spec(engine=engines.SGLANG, extra=("--attention-backend", "triton")) -> kinds.ServerSpec:
    return kinds.ServerSpec(engine, "/models/tiny", "/opt/py/bin/python3", extra, port=31000)


def test_cold_kinds_point_every_cache_variable_at_its_own_empty_directory(tmp_path):
    for kind in sorted(kinds.COLD_KINDS):
        work = tmp_path / kind
        plan = kinds.plan(kind, _spec(), work, archive=tmp_path / "archive", environ=HOST)
        paths = [Path(plan.env[v.name]) for v in caches.CACHE_VARIABLES]
        assert len(set(paths)) == len(paths)
        for path in paths:
            assert path.is_dir() and not any(path.iterdir()), path
            assert work in path.parents  # under this start's own directory
        assert plan.env["TVM_FFI_CACHE_DIR"] and plan.env["FLASHINFER_WORKSPACE_BASE"] and plan.env["VLLM_CACHE_ROOT"]


def test_warm_kinds_leave_the_caches_as_they_are(tmp_path):
    for kind in ("base-warm", "save", "load-warm"):
        plan = kinds.plan(kind, _spec(), tmp_path / kind, archive=tmp_path / "archive", environ=HOST)
        assert not set(plan.env) & {v.name for v in caches.CACHE_VARIABLES}, kind
        assert not (tmp_path / kind).exists()  # no cache directories made


def test_with_the_runs_own_caches_every_kind_points_at_the_same_directories(tmp_path):
    # A cold start then differs from a warm one by the contents alone (the harness empties them),
    # not by the paths: what an archive carries for SAVE's paths applies to a cold LOAD too.
    run_caches = tmp_path / "caches"
    envs = [kinds.plan(kind, _spec(), tmp_path / kind, archive=tmp_path / "archive", environ=HOST,
                       caches=run_caches).env for kind in kinds.KINDS]
    for var in caches.CACHE_VARIABLES:
        assert {env[var.name] for env in envs} == {str(run_caches / var.subdir)}, var.name
        assert (run_caches / var.subdir).is_dir()


def test_every_kind_asks_for_foundry_on_the_command_line_or_not_at_all(tmp_path):
    archive = tmp_path / "archive"
    commands = {k: kinds.plan(k, _spec(), tmp_path / k, archive, HOST) for k in kinds.KINDS}
    for kind, plan in commands.items():
        assert plan.env["FOUNDRY_ARCHIVE"] is None and plan.env["FOUNDRY_MODE"] is None
        assert plan.env["PYTHONUNBUFFERED"] == "1"
        assert plan.argv[:6] == ["/opt/py/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/tiny",
                                 "--host"]
        assert plan.argv[-2:] == ["--attention-backend", "triton"]  # the user's arguments come last
    assert "--foundry-archive" not in commands["base-warm"].argv + commands["base-cold"].argv
    for kind, mode in (("save", "save"), ("load-warm", "load"), ("load-cold", "load")):
        argv = commands[kind].argv
        assert argv[argv.index("--foundry-archive") + 1] == str(archive)
        assert argv[argv.index("--foundry-mode") + 1] == mode


def test_cold_environment_keeps_the_hosts_packages_and_downloads(tmp_path):
    home = tmp_path / "home"
    (home / ".local").mkdir(parents=True)
    (home / ".cache" / "huggingface").mkdir(parents=True)
    env = caches.cold_environment(tmp_path / "cold", {"HOME": str(home)})
    assert env["HOME"] != str(home)
    assert env["PYTHONUSERBASE"] == str(home / ".local")
    assert env["HF_HOME"] == str(home / ".cache" / "huggingface")
    assert "XDG_CONFIG_HOME" not in env  # ~/.config does not exist there: nothing to keep
    user_set = caches.cold_environment(tmp_path / "cold2", {"HOME": str(home), "HF_HOME": "/data/hf"})
    assert "HF_HOME" not in user_set  # inherited as the user set it


def test_cold_environment_refuses_a_directory_in_use(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        caches.cold_environment(tmp_path / "used", HOST)


@pytest.mark.parametrize("arg", ["--port", "--port=8000", "--host", "--foundry-mode", "--foundry-archive=/a"])
def test_flags_the_harness_sets_are_refused_in_the_engine_arguments(arg):
    with pytest.raises(ValueError, match="sets the host, the port and Foundry's flags itself"):
        _spec(extra=("--seed", "0", arg))


def test_vllm_command_is_vllm_serve():
    argv = _spec(engines.VLLM, ()).argv()
    assert argv == ["/opt/py/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve", "/models/tiny",
                    "--host", "127.0.0.1", "--port", "31000"]


def test_command_template_overrides_the_engine_and_rejects_unknown_fields():
    spec = kinds.ServerSpec(engines.VLLM, "/m", "py", command="/venv/bin/vllm serve {model} --seed 0")
    assert spec.argv()[:4] == ["/venv/bin/vllm", "serve", "/m", "--seed"]
    with pytest.raises(ValueError, match="unknown field 'gpu'"):
        kinds.ServerSpec(engines.VLLM, "/m", "py", command="{python} {gpu}").argv()


def test_round_robin_alternates_kinds_every_round():
    steps = kinds.schedule(["base-warm", "save", "load-warm"], 3, warm_up=False)
    assert [(s.round, s.kind) for s in steps] == [
        (1, "base-warm"), (1, "save"), (1, "load-warm"),
        (2, "base-warm"), (2, "save"), (2, "load-warm"),
        (3, "base-warm"), (3, "save"), (3, "load-warm")]
    assert all(s.recorded for s in steps)


def test_preparation_starts_come_first_and_are_not_recorded():
    steps = kinds.schedule(["load-cold", "base-warm", "save"], 1, warm_up=True)
    assert [(s.kind, s.recorded) for s in steps] == [
        ("base-warm", False), ("save", False), ("load-cold", True), ("base-warm", True), ("save", True)]
    # Warming up covers SAVE's settings too, whenever the run saves or loads.
    assert [(s.kind, s.recorded) for s in kinds.schedule(["base-warm", "save"], 1, warm_up=True)] == [
        ("base-warm", False), ("save", False), ("base-warm", True), ("save", True)]
    assert [s.kind for s in kinds.schedule(["base-warm"], 2, warm_up=True)] == ["base-warm"] * 3
    # Cold kinds alone need no warm host (SAVE runs on the host's caches: it does).
    assert [(s.kind, s.recorded) for s in kinds.schedule(["base-cold", "load-cold"], 1, warm_up=True)] == [
        ("save", False), ("base-cold", True), ("load-cold", True)]
    # A SAVE before the first LOAD needs no extra one.
    assert [s.kind for s in kinds.schedule(["save", "load-warm"], 1, warm_up=False)] == ["save", "load-warm"]


@pytest.mark.parametrize("kinds_, rounds, message", [
    (["base-warm", "fast"], 1, "unknown kind"), ([], 1, "no kinds"), (["save", "save"], 1, "named twice"),
    (["save"], 0, "at least 1")])
def test_bad_schedules_are_refused(kinds_, rounds, message):
    with pytest.raises(ValueError, match=message):
        kinds.schedule(kinds_, rounds, False)


def test_host_is_warm_only_when_each_first_start_cache_holds_a_file(tmp_path):
    env = {"HOME": str(tmp_path), "TVM_FFI_CACHE_DIR": str(tmp_path / "tvm")}
    assert not harness.host_is_warm(engines.SGLANG, env)
    (tmp_path / "tvm" / "mod").mkdir(parents=True)
    (tmp_path / "tvm" / "mod" / "m.so").write_text("x")
    assert not harness.host_is_warm(engines.SGLANG, env)  # FlashInfer's JIT modules are still missing
    jit = tmp_path / ".cache" / "flashinfer" / "0.6.15" / "90a" / "cached_ops" / "norm"
    jit.mkdir(parents=True)
    (jit / "norm.so").write_text("x")
    assert harness.host_is_warm(engines.SGLANG, env)


def test_cli_passes_everything_after_dashes_to_the_engine():
    args = cli.build_parser().parse_args(
        ["ready", "sglang", "/tmp/tiny-qwen3", "--rounds", "2", "--kinds", "base-warm,save", "--keep-logs", "tail",
         "--", "--attention-backend", "triton", "--load-format", "dummy"])
    assert args.engine == "sglang" and args.model == "/tmp/tiny-qwen3" and args.rounds == 2
    assert args.engine_args == ["--attention-backend", "triton", "--load-format", "dummy"]
    assert args.keep_logs == "tail"
    assert cli.build_parser().parse_args(["ready", "vllm", "/m"]).engine_args == []


def test_cli_kinds_are_the_harness_kinds():
    args = cli.build_parser().parse_args(["ready", "vllm", "/m"])
    assert tuple(args.kinds.split(",")) == kinds.KINDS


def test_cli_refuses_an_unknown_kind_before_starting_anything(tmp_path, capsys):
    code = cli.main(["ready", "vllm", "/m", "--kinds", "base-warm,quick", "--results", str(tmp_path / "r"),
                     "--python", "/nonexistent/python"])
    assert code == 2
    assert "unknown kind(s) quick" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
