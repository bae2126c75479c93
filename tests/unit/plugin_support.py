"""Fakes and fixture bodies shared by the engine plugins' tests, test_vllm_plugin.py and
test_sglang_plugin.py (no tests here). Each plugin has the same module layout (register, runtime,
patching, worker_patches, capture_patches, cli, seams), so one helper serves both; what differs per
engine (the fake engine's sources, its graphs and sessions) stays in the test files.

The ``check_*`` methods and functions are the bodies of tests that both files hold under the same
name: the behaviour comes from foundry_core.engine, which both plugins share. The test files register this
module for pytest's assertion rewriting, so a failing check reports its values as a test would."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import textwrap
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from os import PathLike
from typing import Any

import pytest

from foundry_core.engine import EngineSession, Mode, get_plugin_manager
from foundry_core.engine.worker import DeviceOps


# ---- isolation between tests ---------------------------------------------------------------------


def clear_environment(monkeypatch: pytest.MonkeyPatch, keys: Iterable[str]) -> None:
    """Removes ``keys`` from os.environ for the test and restores them afterwards."""
    for key in keys:
        # setenv first: monkeypatch then restores the original value at teardown, also when the
        # plugin wrote the variable itself (register exports the settings and LD_PRELOAD).
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)


@contextlib.contextmanager
def saved_logger(name: str) -> Iterator[logging.Logger]:
    """Puts the logger's handlers, propagation and level back: the plugins configure ``foundry``."""
    log = logging.getLogger(name)
    saved = (list(log.handlers), log.propagate, log.level)
    try:
        yield log
    finally:
        log.handlers[:], log.propagate, log.level = saved


# ---- fake modules --------------------------------------------------------------------------------


def fake_package(name: str) -> types.ModuleType:
    """An empty package (it has ``__path__``), so submodules in sys.modules import under it."""
    mod = types.ModuleType(name)
    mod.__path__ = []  # type: ignore[attr-defined]
    return mod


def install_fake_packages(monkeypatch: pytest.MonkeyPatch, modules: Iterable[str]) -> None:
    """Puts an empty package in sys.modules for every parent of ``modules``, each once."""
    packages: set[str] = set()
    for name in modules:
        parts = name.split(".")
        for i in range(1, len(parts)):
            pkg = ".".join(parts[:i])
            if pkg not in packages:
                packages.add(pkg)
                monkeypatch.setitem(sys.modules, pkg, fake_package(pkg))


def exec_fake_modules(monkeypatch: pytest.MonkeyPatch, sources: dict[str, str]) -> dict[str, Any]:
    """Runs each source as the module of its name (in order, so later ones import earlier ones)
    and sets it as an attribute of its parent package; returns {module name: module}."""
    mods: dict[str, Any] = {}
    for name, source in sources.items():
        mod = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, mod)
        exec(compile(textwrap.dedent(source), f"<fake {name}>", "exec"), mod.__dict__)
        parent, _, leaf = name.rpartition(".")
        setattr(sys.modules[parent], leaf, mod)
        mods[name] = mod
    return mods


def install_fake_torch(monkeypatch: pytest.MonkeyPatch, graph: type, graph_context: type,
                       keep_graph: type) -> types.ModuleType:
    """A torch with only torch.cuda.CUDAGraph and torch.cuda.graph, and foundry_core.cuda_graph
    (which would load libfoundry.so) with ``keep_graph`` as its CUDAGraph; returns the torch."""
    torch = fake_package("torch")
    torch.cuda = types.ModuleType("torch.cuda")  # type: ignore[attr-defined]
    torch.cuda.CUDAGraph = graph  # type: ignore[attr-defined]
    torch.cuda.graph = graph_context  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", torch.cuda)
    keep = types.ModuleType("foundry_core.cuda_graph")
    keep.CUDAGraph = keep_graph  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "foundry_core.cuda_graph", keep)
    return torch


# ---- register ------------------------------------------------------------------------------------


def fake_child_env(archive: str | PathLike[str] | None = None, mode: Mode | str | None = None,
                   env: dict[str, str] | None = None) -> dict[str, str]:
    """prepare_child_environment without libfoundry.so: a fixed LD_PRELOAD and the settings."""
    out = dict(os.environ)
    out["LD_PRELOAD"] = "/opt/foundry/libfoundry.so"
    out["NCCL_CUMEM_ENABLE"] = "0"
    if archive is not None:
        out["FOUNDRY_ARCHIVE"] = os.fspath(archive)
    if mode is not None:
        out["FOUNDRY_MODE"] = Mode(mode).value if not isinstance(mode, Mode) else mode.value
    return out


# ---- adapter and runtime -------------------------------------------------------------------------


class NoRegion:
    """A region runtime for sessions that must not reach the GPU (fingerprints only)."""

    def set_region(self, base: int, size: int) -> None: raise AssertionError("no GPU here")
    def seal(self, offset: int) -> None: raise AssertionError("no GPU here")
    def stop(self) -> None: pass
    def region_info(self) -> Any: raise AssertionError("no GPU here")


def session_fingerprint(adapter: Any, archive: str | PathLike[str] = "/nonexistent/archive") -> dict:
    """The fingerprint a SAVE session computes from ``adapter``'s hooks."""
    session = EngineSession(archive, "save", 0, get_plugin_manager(adapter), runtime=NoRegion())
    return session.fingerprint


class FakePool:
    """A private pool: logged as ``pool``; FakeDevice keeps only a weak reference to it."""

    def __str__(self) -> str:
        return "pool"


class FakeDevice(DeviceOps):
    """Device operations that record their calls in ``log`` (and report ``free`` bytes free);
    ``pools`` holds a weak reference to each private pool handed out."""

    def __init__(self, log: list | None = None, free: int = 1 << 40) -> None:
        self.log = log if log is not None else []
        self.free = free
        self.pools: list[weakref.ref[FakePool]] = []

    def empty_cache(self) -> None:
        self.log.append("empty_cache")

    def free_memory(self) -> int:
        return self.free

    def stop_region(self) -> None:
        self.log.append("stop_region")

    def resume_region(self) -> None:
        self.log.append("resume_region")

    def private_pool(self) -> Any:
        self.log.append("new_pool")
        pool = FakePool()
        self.pools.append(weakref.ref(pool))
        return pool

    def thread_binder(self) -> Callable[[], None]:
        return lambda: None  # no device to make current

    def use_pool(self, pool: Any) -> contextlib.AbstractContextManager[Any]:
        log = self.log

        @contextlib.contextmanager
        def ctx() -> Iterator[None]:
            log.append(f"use:{pool}")
            try:
                yield
            finally:
                log.append("unuse")

        return ctx()


# ---- one plugin's modules, and the checks both plugins pass --------------------------------------


@dataclasses.dataclass(frozen=True)
class Plugin:
    """The modules of one plugin that the shared fixtures reset or replace, and the checks whose
    behaviour lives in foundry_core.engine (the same for both plugins)."""

    register: types.ModuleType
    activation: types.ModuleType
    runtime: types.ModuleType
    patching: types.ModuleType
    worker_patches: types.ModuleType
    capture_patches: types.ModuleType
    cli: types.ModuleType
    seams: types.ModuleType

    def isolation(self, monkeypatch: pytest.MonkeyPatch, env_keys: Iterable[str]) -> Iterator[None]:
        """The body of an autouse fixture: each test starts with no Foundry environment, no
        registered plugin, no runtime and no installed seam, and leaves none behind (the plugins
        keep that state in module globals and os.environ, so a test would leak into the next)."""
        clear_environment(monkeypatch, env_keys)
        self.activation._reset_for_tests()
        self.runtime.reset()
        with saved_logger("foundry"):
            yield
            self.patching.uninstall_all()
            self.activation._reset_for_tests()
            self.runtime.reset()

    def record_activation(self, monkeypatch: pytest.MonkeyPatch, hosts: str) -> dict[str, int]:
        """Counts the seam installs of register() in a process that hosts the engine (the
        plugin's ``hosts`` check answers True) instead of patching the fake engine."""
        monkeypatch.setattr(self.activation, hosts, lambda: True)
        calls = {"worker": 0, "capture": 0}
        monkeypatch.setattr(self.worker_patches, "install", lambda: calls.__setitem__("worker", calls["worker"] + 1))
        monkeypatch.setattr(self.capture_patches, "install",
                            lambda: calls.__setitem__("capture", calls["capture"] + 1))
        return calls

    def record_activations(self, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
        """The settings the CLI seams activate, recorded instead of activated."""
        seen: list[Any] = []
        monkeypatch.setattr(self.activation, "activate", lambda settings: seen.append(settings))
        return seen

    def check_register_off_only_adds_flags(self, register: Callable[[], None], recorded: dict[str, int],
                                           args_class: type, unset: str) -> None:
        """register() without settings (called twice, as engines may) activates nothing and exports
        nothing (neither LD_PRELOAD nor ``unset``), but ``args_class.add_cli_args`` (the engine's
        arguments class, looked up after register() patched it) adds the Foundry flags."""
        register()
        register()
        assert recorded == {"worker": 0, "capture": 0}
        assert "LD_PRELOAD" not in os.environ and unset not in os.environ
        parser = argparse.ArgumentParser()
        args_class.add_cli_args(parser)
        assert parser.parse_args(["--foundry-archive", "/a"]).foundry_archive == "/a"

    def check_strict_setting_and_mode_off(self, recorded: dict[str, int], monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: PathLike[str]) -> None:
        """register() activates nothing with FOUNDRY_MODE=off, and keeps a user's FOUNDRY_STRICT."""
        register_mod = self.register
        monkeypatch.setattr(self.activation, "prepare_child_environment", fake_child_env)
        monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
        monkeypatch.setenv("FOUNDRY_MODE", "off")
        register_mod.register()
        assert recorded == {"worker": 0, "capture": 0} and "LD_PRELOAD" not in os.environ
        self.activation._reset_for_tests()
        monkeypatch.setenv("FOUNDRY_MODE", "save")
        monkeypatch.setenv("FOUNDRY_STRICT", "0")
        register_mod.register()
        assert os.environ["FOUNDRY_STRICT"] == "0" and os.environ["FOUNDRY_MODE"] == "save"

    def check_real_child_environment(self, monkeypatch: pytest.MonkeyPatch, tmp_path: PathLike[str]) -> None:
        """register() with the real prepare_child_environment (skipped without libfoundry.so)."""
        from foundry_core.preload import preload_environment

        try:
            preload_environment({})
        except FileNotFoundError as exc:
            pytest.skip(f"libfoundry.so is not built here: {exc}")
        monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
        monkeypatch.setenv("FOUNDRY_MODE", "load")
        self.register.register()
        assert "libfoundry.so" in os.environ["LD_PRELOAD"].split(":")[0]
        assert os.environ["NCCL_CUMEM_ENABLE"] == "0" and os.environ["NCCL_NVLS_ENABLE"] == "0"
        assert os.environ["FOUNDRY_MODE"] == "load"

    def check_cli_flags_added_once(self, args_class: type, capsys: pytest.CaptureFixture[str]) -> None:
        """Installing the CLI seam twice, or adding the flags to a parser twice, adds them once;
        an unknown --foundry-mode is refused naming the valid ones. ``args_class`` is the engine's
        arguments class (its add_cli_args looked up after the install patched it)."""
        cli = self.cli
        cli.install(strict=True)
        cli.install(strict=True)
        parser = argparse.ArgumentParser()
        args_class.add_cli_args(parser)
        cli.add_foundry_args(parser)  # the same parser twice: no argparse conflict
        with pytest.raises(SystemExit):
            parser.parse_args(["--foundry-mode", "restore"])
        assert "auto" in capsys.readouterr().err

    def check_wrong_shape_cli_seam(self, monkeypatch: pytest.MonkeyPatch, module: str, owner: str,
                                   version_getter: str) -> None:
        """A CLI seam whose ``from_cli_args`` is no longer a classmethod is refused by name, with
        the engine version and the way out. ``module.owner`` is the engine's arguments class,
        ``version_getter`` the patching function that reports the engine version."""
        install_fake_packages(monkeypatch, [module])
        mod = types.ModuleType(module)

        class Args:
            @staticmethod
            def add_cli_args(parser):
                return parser

            def from_cli_args(self, args):  # no longer a classmethod
                return self

        Args.__name__ = Args.__qualname__ = owner
        setattr(mod, owner, Args)
        monkeypatch.setitem(sys.modules, module, mod)
        monkeypatch.setattr(self.patching, version_getter, lambda: "9.9.9")
        with pytest.raises(self.patching.SeamError) as err:
            self.cli.install(strict=True)
        text = str(err.value)
        assert "cli.from_cli_args" in text and "9.9.9" in text and "classmethod" in text \
            and "--foundry-mode off" in text

    def check_seam_list(self, engine: str, source_file: str) -> None:
        """Every seam the patches use is in seams.SEAMS, once, with a purpose and a module of
        ``engine``; ``source_file`` is one of the files the contract tests extract."""
        seams = self.seams
        names = [s.name for s in seams.SEAMS]
        assert len(names) == len(set(names))
        used = [*self.worker_patches.WRAPPERS, *self.capture_patches.WRAPPERS, "cli.add_cli_args",
                "cli.from_cli_args"]
        assert set(used) <= set(names)
        for s in seams.SEAMS:
            assert s.purpose and s.module.startswith(engine)
        assert source_file in seams.source_files()
        with pytest.raises(KeyError, match="known"):
            seams.seam("worker.nope")

    def check_patching_is_idempotent_and_reversible(self, owner: type) -> None:
        """Installing the ``from_cli_args`` seam of ``owner`` twice wraps it once; uninstall_all
        puts the original classmethod back."""
        patching, cli = self.patching, self.cli
        before = owner.__dict__["from_cli_args"]
        assert patching.install("cli.from_cli_args", cli.wrap_from_cli_args)
        assert not patching.install("cli.from_cli_args", cli.wrap_from_cli_args)
        wrapped = owner.__dict__["from_cli_args"]
        assert isinstance(wrapped, classmethod) and getattr(wrapped.__func__, patching.MARKER) == "cli.from_cli_args"
        patching.uninstall_all()
        assert owner.__dict__["from_cli_args"] is before


# ---- runtime pauses ------------------------------------------------------------------------------


def check_pause_nesting(rt: Any, dev: FakeDevice) -> None:
    """A pause stops the region in a private pool, nests without a second stop, and a skipped step
    pauses with nothing inside."""
    with rt.paused():
        dev.log.append("work")
        with rt.paused():
            dev.log.append("inner")
    assert dev.log == ["empty_cache", "stop_region", "new_pool", "use:pool", "work", "inner", "unuse",
                       "empty_cache", "resume_region"]
    dev.log.clear()
    rt.skipped("something")
    assert dev.log == ["empty_cache", "stop_region", "new_pool", "use:pool", "unuse", "empty_cache", "resume_region"]


def check_pause_resumes_after_failure(rt: Any, dev: FakeDevice) -> None:
    """Work that raises inside a pause still resumes the region."""
    with pytest.raises(ValueError), rt.paused():
        raise ValueError("boom")
    assert dev.log[-1] == "resume_region"


def check_no_pause_after_finish(rt: Any, dev: FakeDevice) -> None:
    """Once the runtime has finished (the region is closed), a pause does nothing."""
    rt.finish()
    dev.log.clear()
    with rt.paused():
        dev.log.append("after")
    assert dev.log == ["after"]


# ---- the start-up hook starting a plugin's fork server -----------------------------------------

# The server module the hook's command runs: it says whether this process started a fork server.
SAYS_RUNNING = """
import gc, json, os
from foundry_core.engine import preload_active
from foundry_core.engine.fork_server import client
print(json.dumps({"running": client.running(), "preload_active": preload_active(), "collecting": gc.isenabled(),
                  "restarted": os.environ.get("FOUNDRY_AUTOPRELOAD_RESTARTED") == "1"}))
"""


def early_start_installed(name: str) -> bool:
    """Whether foundry-core's start-up hook and the ``foundry.early_start`` entry point ``name`` are
    installed (the fork-server tests that start a real interpreter need both)."""
    import importlib.util
    from importlib.metadata import entry_points

    return (importlib.util.find_spec("_foundry_autopreload") is not None
            and any(ep.name == name for ep in entry_points(group="foundry.early_start")))


def fork_server_started_by_the_hook(tmp_path: PathLike, module: str, argv: list[str], env: dict[str, str],
                                    preloaded: bool = True) -> bool:
    """Runs ``python -m module *argv`` with Foundry asked for (``FOUNDRY_ARCHIVE``), ``module`` a
    synthetic package's module printing whether the start-up hook started a fork server; returns
    that. ``preloaded``: started under the preload (``foundry run``), else as users start it (the
    hook then restarts the process under the preload only when no fork server hosts its GPU
    processes: checked here)."""
    import json
    import pathlib
    import subprocess

    from foundry_core.preload import preload_environment

    root = pathlib.Path(tmp_path)
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    for d in path.relative_to(root).parents:
        if str(d) != ".":
            (root / d / "__init__.py").touch()
    path.write_text(SAYS_RUNNING)
    base = {k: v for k, v in os.environ.items() if not k.startswith("FOUNDRY_") and k != "LD_PRELOAD"}
    base.update({"FOUNDRY_ARCHIVE": str(root / "archive"), "TMPDIR": str(root),
                 "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])})
    full = preload_environment(base) if preloaded else base
    proc = subprocess.run([sys.executable, "-m", module, *argv], env={**full, **env}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # The engine's imports run without collections where a fork server will launch its GPU processes.
    assert result["collecting"] is not result["running"], result
    if not preloaded and env.get("FOUNDRY_MODE") != "off":
        assert result["restarted"] is not result["running"], result  # restarted only without a fork server
        assert result["preload_active"] is result["restarted"], result
    return result["running"]
