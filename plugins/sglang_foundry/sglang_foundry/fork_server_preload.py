"""Imported by the fork server (``fork_server.py``) before it forks any child: imports what SGLang's
scheduler and detokenizer processes import, then writes whether the process is still safe to fork
from (:func:`foundry_core.engine.fork_server.preload.run`)."""

from __future__ import annotations

from foundry_core.engine import triton_at_import
from foundry_core.engine.fork_server import preload

# What a scheduler and a detokenizer import before they do anything: their spawn targets' modules,
# and this plugin's entry point with the seams a scheduler installs, which its load_plugins() would
# import (0.12-0.20 s on the H200) after the fork.
MODULES = ("sglang.srt.managers.scheduler", "sglang.srt.managers.detokenizer_manager", "sglang_foundry.register",
           "sglang_foundry.worker_patches", "sglang_foundry.capture_patches", "sglang_foundry.prefill_patches")

if preload.in_fork_server():
    # SGLang's imports build Triton's cuda_utils (server_args imports the fla kernels): a LOAD on a
    # new host places the archive's copy first.
    preload.run(MODULES, before=triton_at_import.place_from_environ)
