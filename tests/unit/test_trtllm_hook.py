"""trtllm-foundry's start-up hook and import hook, in child processes that start as an installed
plugin would: the synthetic TensorRT-LLM of test_trtllm_fake.py on the path, and the plugin's
``trtllm-foundry.pth`` processed at interpreter start-up (a ``sitecustomize`` on PYTHONPATH adds
a site directory holding the .pth and its hook module, which Python processes exactly like
site-packages). Each child reports, as JSON, what its TensorRT-LLM modules look like after import.

What must hold: with no archive set nothing changes (no finder, the plugin not even imported);
with Foundry active every seam is patched once, nothing outside the seam table is touched, and the
hook itself never imports TensorRT-LLM; the same in a multiprocessing spawn child and in a process
started with sys.executable (as MPI starts TensorRT-LLM's workers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_trtllm_fake import PLUGIN_DIR, write_tree

from trtllm_foundry import capture_patches, cli, importhook, llm_patches, seams, worker_patches

CLICK = """
    class Option:
        def __init__(self, decls, **kw):
            self.name = decls[-1].lstrip("-").replace("-", "_")
            self.kw = kw

    class Argument(Option):
        pass

    class Choice:
        def __init__(self, choices):
            self.choices = choices

    class Command:
        def __init__(self, name, callback, params):
            self.name, self.callback, self.params = name, callback, params

    def _param(cls, decls, kw):
        def deco(f):
            f.__dict__.setdefault("__click_params__", []).insert(0, cls(list(decls), **kw))
            return f
        return deco

    def option(*decls, **kw):
        return _param(Option, decls, kw)

    def argument(*decls, **kw):
        return _param(Argument, decls, kw)

    def command(name):
        def deco(f):
            return Command(name, f, list(getattr(f, "__click_params__", [])))
        return deco
"""

TORCH = """
    import types

    cuda = types.SimpleNamespace(CUDAGraph=object, graph=None, is_current_stream_capturing=lambda: False)
"""

PROBE = r'''
import inspect, json, multiprocessing, os, subprocess, sys

TREE = os.environ["PROBE_TREE"]
MODULES = ["tensorrt_llm._torch.pyexecutor.py_executor_creator", "tensorrt_llm.llmapi.llm",
           "tensorrt_llm.commands.serve", "tensorrt_llm._torch.autotuner", "tensorrt_llm._torch.utils"]


def report():
    out = {"trtllm_before_import": "tensorrt_llm" in sys.modules,
           "plugin_imported": "trtllm_foundry" in sys.modules,
           "finders": sum(type(f).__name__ == "PatchingFinder" for f in sys.meta_path),
           "archive": os.environ.get("FOUNDRY_ARCHIVE"), "mode": os.environ.get("FOUNDRY_MODE")}
    for name in MODULES:
        __import__(name)
    if out["finders"]:
        from trtllm_foundry import importhook
        importhook.install()  # a second install changes nothing
        out["finders_after_second_install"] = sum(type(f).__name__ == "PatchingFinder" for f in sys.meta_path)
    patched, foreign, twice = {}, [], []
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("tensorrt_llm"):
            continue
        for attr, value in list(vars(mod).items()):
            owners = [(attr, value)]
            if inspect.isclass(value) and value.__module__ == modname:
                owners += [(f"{attr}.{k}", inspect.getattr_static(value, k)) for k in vars(value)]
            for dotted, raw in owners:
                func = getattr(raw, "__func__", raw)
                base = func
                while not hasattr(base, "__foundry_seam__") and hasattr(base, "__wrapped__"):
                    base = base.__wrapped__  # the tree's own decorators (contextmanager)
                code = getattr(base, "__code__", None)
                if code is None or getattr(func, "__module__", modname) != modname and not hasattr(func, "__foundry_seam__"):
                    continue
                if not code.co_filename.startswith(TREE):
                    foreign.append(f"{modname}.{dotted}")
                marker = getattr(func, "__foundry_seam__", None)
                if marker is not None:
                    patched[f"{modname}.{dotted}"] = marker
                    if hasattr(getattr(func, "__wrapped__", None), "__foundry_seam__"):
                        twice.append(marker)
    serve = sys.modules["tensorrt_llm.commands.serve"].serve
    out.update(patched=patched, foreign=sorted(foreign), twice=twice, serve_params=[p.name for p in serve.params])
    return out


def child(queue):
    queue.put(report())


if __name__ == "__main__":
    how = sys.argv[1]
    if how == "here":
        print(json.dumps(report()))
    elif how == "spawn":
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        p = ctx.Process(target=child, args=(queue,))
        p.start()
        result = queue.get(timeout=120)
        p.join()
        print(json.dumps(result))
    elif how == "executable":
        done = subprocess.run([sys.executable, __file__, "here"], capture_output=True, text=True, check=True)
        print(done.stdout.strip().splitlines()[-1])
'''


@pytest.fixture
def probe(tmp_path):
    """Runs the probe in a fresh interpreter (``how``: here, spawn, executable) with ``env``; returns its report."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(PLUGIN_DIR / "trtllm-foundry.pth", site)
    shutil.copy(PLUGIN_DIR / "_trtllm_foundry_hook.py", site)
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site)!r})\n")
    tree = write_tree(tmp_path / "tree")
    (tree / "torch").mkdir()
    (tree / "torch" / "__init__.py").write_text(textwrap.dedent(TORCH))
    try:
        import click  # noqa: F401
    except ImportError:
        (tree / "click.py").write_text(textwrap.dedent(CLICK))
    script = tmp_path / "probe.py"
    script.write_text(PROBE)

    def run(how: str = "here", args: tuple[str, ...] = (), **env: str) -> dict:
        full = {k: v for k, v in os.environ.items() if not k.startswith(("FOUNDRY_", "TLLM_"))}
        full.update(env)
        full["PYTHONPATH"] = os.pathsep.join([str(boot), str(tree), str(PLUGIN_DIR), full.get("PYTHONPATH", "")])
        full["PROBE_TREE"] = str(tree)
        full["FOUNDRY_AUTOPRELOAD"] = "0"  # no restart under the preload here: the hook is what is tested
        done = subprocess.run([sys.executable, str(script), how, *args], env=full, capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    run.archive = str(tmp_path / "archive")  # type: ignore[attr-defined]
    return run


WRAPPED = {**worker_patches.WRAPPERS, **capture_patches.WRAPPERS, **llm_patches.WRAPPERS}
EXPECTED = {seams.seam(name).target: name for name in WRAPPED}


def test_without_an_archive_nothing_changes(probe):
    r = probe()
    assert (r["finders"], r["plugin_imported"], r["patched"], r["foreign"]) == (0, False, {}, [])
    assert r["serve_params"] == ["model", "port"]


@pytest.mark.parametrize("env", [{"FOUNDRY_MODE": "off"}, {"FOUNDRY_TRTLLM_HOOK": "0"}])
def test_mode_off_or_the_hook_disabled_changes_nothing(probe, env):
    r = probe(FOUNDRY_ARCHIVE=probe.archive, **env)
    assert (r["finders"], r["patched"], r["foreign"]) == (0, {}, [])


def test_active_patches_every_seam_once_and_nothing_else(probe):
    r = probe(FOUNDRY_ARCHIVE=probe.archive)
    assert r["trtllm_before_import"] is False  # the hook never imports TensorRT-LLM itself
    assert (r["finders"], r["finders_after_second_install"]) == (1, 1)
    assert r["patched"] == EXPECTED and r["twice"] == []
    # Everything in TensorRT-LLM's modules that is not TensorRT-LLM's code is a seam of the table.
    assert set(r["foreign"]) == set(EXPECTED)
    assert r["serve_params"] == ["model", "port", "foundry_archive", "foundry_mode"]


@pytest.mark.parametrize("how", ["spawn", "executable"])
def test_a_spawned_worker_is_patched_too(probe, how):
    r = probe(how, FOUNDRY_ARCHIVE=probe.archive)
    assert r["patched"] == EXPECTED and r["trtllm_before_import"] is False
    off = probe(how)
    assert off["patched"] == {} and off["finders"] == 0


def test_command_line_flags_are_exported_at_start_up(probe):
    r = probe("executable", ("--foundry-archive", "arch", "--foundry-mode=load"))
    assert r["archive"] == str(Path(probe.archive).parent / "arch") and r["mode"] == "load"
    assert r["patched"] == EXPECTED  # the child inherited them, as MPI workers do


def test_targets_match_the_seam_table():
    wrapped_modules = {seams.seam(name).module for name in WRAPPED} | {seams.seam(cli.SEAM).module}
    assert set(importhook.TARGETS) == wrapped_modules
    for module, plugin_modules in importhook.TARGETS.items():
        names = {n for pm in plugin_modules for n in getattr(__import__(pm, fromlist=["x"]), "WRAPPERS", {})
                 if seams.seam(n).module == module}
        expected = {n for n in WRAPPED if seams.seam(n).module == module}
        assert names == expected or (module == seams.seam(cli.SEAM).module and plugin_modules == ("trtllm_foundry.cli",))
    assert set(WRAPPED) | {cli.SEAM} <= set(seams.BY_NAME)


def test_the_start_up_hook_imports_only_os_and_sys_when_inactive():
    code = ("import sys; before = set(sys.modules); import _trtllm_foundry_hook as h; h.start(); "
            "print(sorted(set(sys.modules) - before - {'_trtllm_foundry_hook', '__future__'}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOUNDRY_")}
    env["PYTHONPATH"] = str(PLUGIN_DIR)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
