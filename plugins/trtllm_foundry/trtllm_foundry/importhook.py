"""Patching TensorRT-LLM's modules as they are imported (TensorRT-LLM has no plugin entry point).

:func:`install` (called by the start-up hook ``_trtllm_foundry_hook`` when Foundry is active) puts
one finder first on ``sys.meta_path``. For the few modules whose seams the plugin wraps
(:data:`TARGETS`; the autotuner's seams are only called) it finds the module's spec through the
other finders and wraps its loader: right after the module's own code has run, the plugin's patch
modules wrap that module's seams (:mod:`trtllm_foundry.seams`).
Every other import is answered "not mine" after one dict lookup. Modules already imported when
:func:`install` runs are patched at once.

This module imports nothing of TensorRT-LLM and nothing of the plugin's patch modules until a
target module is imported (nor ``importlib.abc``, ``typing`` or ``threading``: the finder and
loader protocols need no base class), so installing it costs next to nothing. Installing twice installs one
finder; patching is idempotent (:mod:`trtllm_foundry.patching`).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["TARGETS", "install", "uninstall", "installed", "patch_module", "PatchingFinder"]

# TensorRT-LLM module -> the plugin modules whose install(module) wraps the seams it holds
# (tests/unit/test_trtllm_hook.py checks this against the seam table and the wrappers).
TARGETS: dict[str, tuple[str, ...]] = {
    "tensorrt_llm.commands.serve": ("trtllm_foundry.cli",),
    "tensorrt_llm.llmapi.llm": ("trtllm_foundry.llm_patches",),
    "tensorrt_llm._torch.pyexecutor.model_engine": ("trtllm_foundry.worker_patches", "trtllm_foundry.capture_patches"),
    "tensorrt_llm._torch.pyexecutor._util": ("trtllm_foundry.worker_patches",),
    "tensorrt_llm._torch.pyexecutor.cuda_graph_runner": ("trtllm_foundry.capture_patches",),
}


def patch_module(name: str) -> None:
    """Wraps the seams of TensorRT-LLM module ``name`` (already in sys.modules)."""
    for plugin_module in TARGETS.get(name, ()):
        importlib.import_module(plugin_module).install(name)


class _PatchingLoader:
    """The module's own loader, then :func:`patch_module`; everything else is the inner loader's."""

    def __init__(self, inner: object, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: object) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        patch_module(self._name)

    def __getattr__(self, attr: str) -> object:  # get_source, get_filename, is_package, resource readers
        return getattr(self._inner, attr)


class PatchingFinder:
    """Finds the target modules through the finders after it and wraps their loaders."""

    def __init__(self) -> None:
        self._busy: set[str] = set()  # names being looked up through the other finders

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname not in TARGETS or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


def installed() -> PatchingFinder | None:
    """The finder installed in this process, or None."""
    return next((f for f in sys.meta_path if isinstance(f, PatchingFinder)), None)


def install() -> PatchingFinder:
    """Installs the finder once (first on sys.meta_path) and patches the targets already imported."""
    finder = installed()
    if finder is None:
        finder = PatchingFinder()
        sys.meta_path.insert(0, finder)
    for name in TARGETS:
        if name in sys.modules:
            patch_module(name)
    return finder


def uninstall() -> None:
    """Removes the finder (tests); patched modules stay patched."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, PatchingFinder)]
