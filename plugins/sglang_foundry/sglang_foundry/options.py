"""The plugin's own environment variables (all optional; the defaults are the validated path).

- ``FOUNDRY_SGLANG_WARMUP_FORWARDS=paused|region`` (default ``paused``): where SAVE runs the two
  eager warmup forwards ``FullCudaGraphBackend.capture_one`` makes before each capture. ``paused``:
  outside the region, in a private PyTorch pool, so the per-shape preparation that follows lands
  where LOAD (which skips them) puts it; ``region``: in the region, as vLLM's plugin does (lazily
  created buffers such as cuBLAS workspaces then live in the region). Part of the fingerprint.
- ``FOUNDRY_SGLANG_INSTANTIATE=eager|parallel|lazy|background`` (default ``eager``) and
  ``FOUNDRY_SGLANG_INSTANTIATE_THREADS`` (default 4): how LOAD instantiates the restored graphs.
- ``FOUNDRY_SGLANG_CHECK_METADATA=0``: LOAD no longer compares the attention-metadata addresses of
  each captured shape with SAVE's.
- ``FOUNDRY_SGLANG_PREFILL_GRAPHS=0``: SGLang's prefill CUDA graphs (the ``breakable`` backend, its
  CUDA default) are refused instead of saved and restored with the decode graphs (then start SGLang
  with ``--disable-prefill-cuda-graph``). A LOAD whose prefill placements differ from SAVE's falls
  back to a normal start either way.
- ``FOUNDRY_SGLANG_TORCH_COMPILE=0``: ``--enable-torch-compile`` is refused instead of saved and
  restored (the graphs captured from SGLang's compiled forward; a LOAD needs none of the compiled
  code, docs/engine-sglang.md, section 7).
- ``FOUNDRY_SGLANG_TENSOR_PARALLEL=1``: tensor parallel (``--tp-size N`` on one node) is saved and
  restored, its all-reduces through NCCL (the plugin turns SGLang's custom all-reduce off). Off by
  default: it has not run on several GPUs yet, and a rank that restored while another captured
  would wait for it forever.
- ``FOUNDRY_SGLANG_PREFILL_TRACE=FILE``: each prefill shape's capture (SAVE) or stand-in (LOAD)
  appends PyTorch's cached segments at its end to FILE (JSON lines): what to compare when a LOAD's
  prefill placements diverge.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from foundry_core.engine.options import env_flag
from foundry_core.errors import InvalidArgumentError

WARMUP_FORWARDS_ENV = "FOUNDRY_SGLANG_WARMUP_FORWARDS"
WARMUP_FORWARDS = ("paused", "region")
INSTANTIATE_ENV = "FOUNDRY_SGLANG_INSTANTIATE"
INSTANTIATE_THREADS_ENV = "FOUNDRY_SGLANG_INSTANTIATE_THREADS"
CHECK_METADATA_ENV = "FOUNDRY_SGLANG_CHECK_METADATA"
PREFILL_GRAPHS_ENV = "FOUNDRY_SGLANG_PREFILL_GRAPHS"
PREFILL_TRACE_ENV = "FOUNDRY_SGLANG_PREFILL_TRACE"
TORCH_COMPILE_ENV = "FOUNDRY_SGLANG_TORCH_COMPILE"
TENSOR_PARALLEL_ENV = "FOUNDRY_SGLANG_TENSOR_PARALLEL"


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def warmup_forwards(environ: Mapping[str, str] | None = None) -> str:
    """Where SAVE runs the capture warmup forwards: ``paused`` or ``region``."""
    value = _env(environ).get(WARMUP_FORWARDS_ENV, "").strip().lower() or WARMUP_FORWARDS[0]
    if value not in WARMUP_FORWARDS:
        raise InvalidArgumentError(f"{WARMUP_FORWARDS_ENV}={value!r}: choose one of {', '.join(WARMUP_FORWARDS)}")
    return value


def instantiate_mode(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """How LOAD instantiates the restored graphs (mode, threads)."""
    from foundry_core.graphs import MODES

    env = _env(environ)
    mode = env.get(INSTANTIATE_ENV, "").strip().lower() or "eager"
    if mode not in MODES:
        raise InvalidArgumentError(f"{INSTANTIATE_ENV}={mode!r}: choose one of {', '.join(MODES)}")
    try:
        threads = int(env.get(INSTANTIATE_THREADS_ENV, "4"))
    except ValueError:
        raise InvalidArgumentError(f"{INSTANTIATE_THREADS_ENV} must be an integer") from None
    return mode, max(threads, 1)


def check_metadata(environ: Mapping[str, str] | None = None) -> bool:
    """Whether LOAD compares attention-metadata addresses with SAVE's (default yes)."""
    return env_flag(CHECK_METADATA_ENV, True, environ)


def prefill_graphs(environ: Mapping[str, str] | None = None) -> bool:
    """Whether SGLang's breakable prefill CUDA graphs are saved and restored (default yes; 0 refuses them)."""
    return env_flag(PREFILL_GRAPHS_ENV, True, environ)


def torch_compile(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``--enable-torch-compile`` starts are saved and restored (default yes; 0 refuses them)."""
    return env_flag(TORCH_COMPILE_ENV, True, environ)


def prefill_trace(environ: Mapping[str, str] | None = None) -> str | None:
    """The file the prefill shapes' allocator segments are appended to, or None."""
    return _env(environ).get(PREFILL_TRACE_ENV, "").strip() or None


def tensor_parallel(environ: Mapping[str, str] | None = None) -> bool:
    """Whether tensor parallel starts are saved and restored (``FOUNDRY_SGLANG_TENSOR_PARALLEL=1``;
    default off, see the module)."""
    return env_flag(TENSOR_PARALLEL_ENV, False, environ)
