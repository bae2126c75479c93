"""Imported by the fork server (``fork_server.py``) before it forks any child: imports what vLLM's
engine core imports before and while it builds its worker, then writes whether the process is
still safe to fork from (:func:`foundry_core.engine.fork_server.preload.run`)."""

from __future__ import annotations

from foundry_core.engine.fork_server import preload

# The engine core's spawn target and its single-GPU executor (unpickled by the child), the worker
# and model runner it builds, and this plugin's entry point, which the engine core's
# load_general_plugins() imports, with the worker and capture seams it installs there.
MODULES = ("vllm.v1.engine.core", "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.gpu_worker",
           "vllm.v1.worker.gpu_model_runner", "vllm_foundry.register", "vllm_foundry.worker_patches",
           "vllm_foundry.capture_patches")

if preload.in_fork_server():
    preload.run(MODULES)
