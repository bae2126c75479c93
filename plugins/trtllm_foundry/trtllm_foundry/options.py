"""trtllm-foundry's own environment variables (all optional; the defaults are the designed path).

- ``FOUNDRY_TRTLLM_WARMUP_FORWARDS=paused|region`` (default ``paused``): where SAVE runs the work a
  LOAD start skips (the two eager warmup forwards ``CUDAGraphRunner.capture`` makes before each
  capture, and the autotuner's warmup forward). ``paused``: outside the deterministic region, in a
  private PyTorch pool, so what follows lands where LOAD puts it; ``region``: in the region (lazily
  created workspaces then live in the region; the allocation sequence of LOAD differs, which its
  address checks catch). Part of the fingerprint.
- ``FOUNDRY_TRTLLM_INSTANTIATE=eager|parallel|lazy|background`` (default ``eager``) and
  ``FOUNDRY_TRTLLM_INSTANTIATE_THREADS`` (default 4): how LOAD instantiates the restored graphs.
- ``FOUNDRY_TRTLLM_CHECK_METADATA=0``: LOAD no longer compares the addresses of each graph's
  attention metadata and of the runner's static input buffers with SAVE's before installing it.
"""

from __future__ import annotations

from collections.abc import Mapping

from foundry_core.engine import options

__all__ = ["WARMUP_FORWARDS_ENV", "WARMUP_FORWARDS", "INSTANTIATE_ENV", "INSTANTIATE_THREADS_ENV",
           "CHECK_METADATA_ENV", "warmup_forwards", "instantiate_mode", "check_metadata"]

WARMUP_FORWARDS_ENV = "FOUNDRY_TRTLLM_WARMUP_FORWARDS"
WARMUP_FORWARDS = ("paused", "region")
INSTANTIATE_ENV = "FOUNDRY_TRTLLM_INSTANTIATE"
INSTANTIATE_THREADS_ENV = "FOUNDRY_TRTLLM_INSTANTIATE_THREADS"
CHECK_METADATA_ENV = "FOUNDRY_TRTLLM_CHECK_METADATA"


def warmup_forwards(environ: Mapping[str, str] | None = None) -> str:
    """Where SAVE runs the warmup forwards LOAD skips: ``paused`` or ``region``."""
    return options.env_choice(WARMUP_FORWARDS_ENV, WARMUP_FORWARDS, WARMUP_FORWARDS[0], environ)


def instantiate_mode(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """How LOAD instantiates the restored graphs: (mode, threads)."""
    return options.instantiate_mode(INSTANTIATE_ENV, INSTANTIATE_THREADS_ENV, environ)


def check_metadata(environ: Mapping[str, str] | None = None) -> bool:
    """Whether LOAD compares each graph's input and metadata addresses with SAVE's (default yes)."""
    return options.env_flag(CHECK_METADATA_ENV, True, environ)
