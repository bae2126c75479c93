"""The seam of the process that runs ``LLM(...)`` or ``trtllm-serve``, before the workers start.

``_TorchLLM._build_model`` (TensorRT-LLM 1.2 ``llmapi/llm.py``) creates the executor: by default a
``GenerationExecutorProxy`` whose MPI pool spawns one worker per rank (also at TP1), or an
in-process worker with ``TLLM_WORKER_USE_SINGLE_PROCESS=1``. Before that, when Foundry is active:

- an unsupported configuration is refused (``self.args``, the validated ``TorchLlmArgs``), before
  any worker exists;
- the environment every worker inherits is prepared (:func:`foundry_core.engine.plugin_child_environment`:
  libfoundry.so in ``LD_PRELOAD``, the NCCL settings, the ``FOUNDRY_*`` variables,
  ``FOUNDRY_STRICT=1`` unless set) and Foundry's logging is set up, once per process.

The preload itself must already be in the environment that started this process (foundry-core's
start-up hook restarts a Python process under it when FOUNDRY_ARCHIVE or --foundry-archive asks
for Foundry; otherwise ``foundry run -- ...``); each worker checks for it before it builds its
model engine and fails with the fix when it is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from foundry_core.engine import Settings, plugin_child_environment, resolve_settings
from foundry_core.engine.mode import Mode
from foundry_core.engine.registration import PluginRegistration

from trtllm_foundry import installing, modes

logger = logging.getLogger("foundry.tensorrt_llm")

__all__ = ["WRAPPERS", "install", "activate", "child_environment"]

_REGISTRATION = PluginRegistration("trtllm-foundry", logger)


def child_environment(settings: Settings) -> dict[str, str]:
    """This process's environment as TensorRT-LLM's workers must inherit it."""
    return plugin_child_environment(settings, plugin="trtllm-foundry", off_hint=modes.OFF_HINT)


def activate(settings: Settings) -> None:
    """Environment for the workers (every call) and logging (once); the seams themselves are
    installed by the import hook as TensorRT-LLM's modules load."""
    _REGISTRATION.activate(settings, child_environment, lambda: None)


def wrap_build_model(original: Callable[..., Any]) -> Callable[..., Any]:
    def _build_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        settings = resolve_settings()
        if settings.mode is not Mode.OFF:
            modes.check_supported(getattr(self, "args", None))
            activate(settings)
        return original(self, *args, **kwargs)

    return _build_model


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "llm.build_model": wrap_build_model,
}


def install(module: str | None = None) -> list[str]:
    """Wraps the LLM-process seam (when ``module`` is its module, or always without one)."""
    return installing.install_wrappers(WRAPPERS, module)


def _reset_for_tests() -> None:
    _REGISTRATION.reset()
