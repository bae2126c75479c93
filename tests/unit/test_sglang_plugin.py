"""sglang-foundry without SGLang: registration, CLI flags, adapter fingerprint, mode refusal, seam
patching, and the SAVE / LOAD flows of the worker and capture seams over a fake SGLang whose
modules have the real names and the shapes listed in sglang_foundry/seams.py (its breakable prefill
graphs, which test_sglang_prefill.py drives, included; the fixtures here turn them off unless a test
asks for them).

The flows run the real EngineSession (mode resolution, fingerprint, engine_state.json written and
read back, fallback policy) over a region runtime without a GPU (test_engine_support.FakeRuntime)
and stand-ins for save_graphs / load_graphs that keep the saved graphs' output tensors."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import importlib
import logging
import math
import multiprocessing
import os
import sys
import textwrap
import threading
import types
from pathlib import Path
from typing import Any

import pytest


from plugin_support import (  # noqa: E402
    FakeDevice, Plugin, check_no_pause_after_finish, check_pause_nesting, check_pause_resumes_after_failure,
    exec_fake_modules, fake_child_env, install_fake_packages, install_fake_torch, session_fingerprint)
from test_engine_support import FakeRuntime, PluginArchiveIO

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "sglang_foundry"
try:
    import sglang_foundry  # noqa: F401  (installed?)
except ImportError:  # not installed: test the source tree
    sys.path.insert(0, str(PLUGIN_DIR))

from foundry_core.engine import Mode  # noqa: E402
from foundry_core.engine.layout import rank_dir  # noqa: E402
from foundry_core.errors import (  # noqa: E402
    DivergenceError, InvalidArgumentError, MismatchError, StateError, UnsupportedError)
from foundry_core.region import LogEntry, compare_placements  # noqa: E402

from sglang_foundry import adapter as adapter_mod  # noqa: E402
from sglang_foundry import (  # noqa: E402
    activation,
    capture_patches,
    cli,
    contract,
    modes,
    options,
    outputs,
    patching,
    prefill_patches,
    runtime,
    seams,
    worker_patches,
)

register_mod = importlib.import_module("sglang_foundry.register")  # the package attribute is the function
PLUGIN = Plugin(register_mod, activation, runtime, patching, worker_patches, capture_patches, cli, seams)

# Variables the plugin writes to os.environ itself (not through monkeypatch): saved and put back.
FOUNDRY_ENV = ("FOUNDRY_ARCHIVE", "FOUNDRY_MODE", "FOUNDRY_STRICT", "FOUNDRY_FALLBACK", "FOUNDRY_SGLANG_INSTANTIATE",
               "FOUNDRY_SGLANG_CHECK_METADATA", "FOUNDRY_SGLANG_WARMUP_FORWARDS", "LD_PRELOAD", "NCCL_CUMEM_ENABLE",
               "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
               "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL")


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    yield from PLUGIN.isolation(monkeypatch, FOUNDRY_ENV)


# ---- a fake SGLang with the real module names -------------------------------------------------


class FakeTensor:
    """A CUDA tensor as far as the plugin looks: an address and a shape; slicing keeps the address."""

    is_cuda = True

    def __init__(self, ptr: int, shape: tuple[int, ...] = (8,)):
        self.ptr, self.shape = ptr, tuple(shape)

    def data_ptr(self) -> int:
        return self.ptr

    def __getitem__(self, item):
        if isinstance(item, slice):
            return FakeTensor(self.ptr, (len(range(*item.indices(self.shape[0]))), *self.shape[1:]))
        return self

    def __repr__(self) -> str:
        return f"FakeTensor({self.ptr:#x}, {self.shape})"

    def new_empty(self, shape) -> FakeTensor:
        return fake_empty(shape)

    def copy_(self, src: FakeTensor) -> FakeTensor:
        return self


class FakeMemory:
    """Device memory as the fake engine allocates it (``torch.empty``): while the region is set
    (``region.active``) and not paused, a bump allocator in the region whose allocations and claims
    go to the region's log (foundry_core.region.LogEntry, tagged); elsewhere otherwise (a pause's
    pool, or no Foundry). Sizes round up to 512 bytes, as PyTorch's caching allocator rounds them."""

    BASE = 0x7F00_0000_0000
    OUTSIDE = 0x10_0000_0000

    def __init__(self, region: Any = None) -> None:
        self.region = region
        self.cursor = 0
        self.live: dict[int, int] = {}
        self.log: list[LogEntry] = []
        self.tag = ""
        self.paused = False
        self._outside = self.OUTSIDE

    def in_region(self) -> bool:
        return self.region is not None and self.region.active and not self.paused

    def alloc(self, nbytes: int) -> int:
        size = -(-max(nbytes, 1) // 512) * 512
        if not self.in_region():
            ptr, self._outside = self._outside, self._outside + size
            return ptr
        offset, self.cursor = self.cursor, self.cursor + size
        self.live[offset] = size
        self._event("alloc", offset, size)
        return self.BASE + offset

    def _event(self, kind: str, offset: int, size: int) -> None:
        self.log.append(LogEntry(len(self.log), kind, offset, size, self.tag))

    def free(self, ptr: int) -> None:
        offset = ptr - self.BASE
        if self.live.pop(offset, None) is not None:
            self._event("free", offset, 0)

    def claim(self, offset: int, size: int) -> bool:
        """foundry_core.region.claim_region: False when exactly that block is live already,
        DivergenceError when the range overlaps another live block."""
        if self.live.get(offset) == size:
            return False
        for live, length in self.live.items():
            if live < offset + size and offset < live + length:
                raise DivergenceError(f"claim [{offset:#x}, +{size:#x}) overlaps the live block at {live:#x}")
        self.live[offset] = size
        self.cursor = max(self.cursor, offset + size)
        self._event("claim", offset, size)
        return True

    def layout(self) -> tuple[int, int]:
        return self.cursor, sum(self.live.values())

    def offset(self, tensor: FakeTensor) -> int:
        return tensor.data_ptr() - self.BASE


def fake_empty(shape, dtype=None, device=None) -> FakeTensor:
    """torch.empty over the fake engine's memory (``sglang.MEMORY``), two bytes an element."""
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    return FakeTensor(sys.modules["sglang"].MEMORY.alloc(2 * math.prod(dims)), dims)


class RegionDevice(FakeDevice):
    """FakeDevice whose pauses move the fake engine's allocations out of the region, with the
    region log, tags and claims of runtime.DeviceOps over a FakeMemory (claims are logged too);
    ``saved_logs`` are the region logs the archive's saves wrote, by rank directory."""

    def __init__(self, log: list, memory: FakeMemory, saved_logs: dict | None = None, free: int = 1 << 40) -> None:
        super().__init__(log, free=free)
        self.memory = memory
        self.saved_logs = saved_logs if saved_logs is not None else {}

    def stop_region(self) -> None:
        super().stop_region()
        self.memory.paused = True

    def resume_region(self) -> None:
        super().resume_region()
        self.memory.paused = False

    def log_position(self) -> int:
        return len(self.memory.log)

    def placements_since(self, first: int) -> list[tuple[int, str, int, int]]:
        return [(e.seq, e.kind, e.offset, e.size) for e in self.memory.log[first:] if e.kind in ("alloc", "free")]

    def placement_divergence(self, saved_log: Any) -> str | None:
        divergence = compare_placements(self.saved_logs.get(Path(saved_log).parent, []), self.memory.log)
        return None if divergence is None else str(divergence)

    def tag(self, text: str) -> None:
        self.memory.tag = text

    def claim(self, offset: int, size: int) -> None:
        self.log.append(("claim", offset, size))
        self.memory.claim(offset, size)

    def region_layout(self) -> tuple[int, int]:
        return self.memory.layout()

    def append_segments(self, path: str, label: str) -> None:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"label": label, "segments": [
                {"address": offset, "size": size, "pool": "(0, 0)", "blocks": [[size, "active_allocated", "here"]]}
                for offset, size in sorted(self.memory.live.items())]}) + "\n")

    def record_history(self) -> None:
        self.log.append(("record_history",))


FAKE_SOURCES = {
    "sglang.srt.plugins": """
        GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"

        def load_plugins():
            pass
    """,
    "sglang.srt.environ": """
        class Envs:
            SGLANG_ENABLE_POST_CAPTURE_KV_SIZING = False
    """,
    "sglang.srt.model_executor.cuda_graph_config": """
        import dataclasses
        from typing import List, Optional

        class Backend:
            FULL = "full"
            BREAKABLE = "breakable"
            TC_PIECEWISE = "tc_piecewise"
            DISABLED = "disabled"

        @dataclasses.dataclass
        class PhaseConfig:
            backend: str = Backend.DISABLED
            max_bs: Optional[int] = None
            bs: Optional[List[int]] = None

        @dataclasses.dataclass
        class CudaGraphConfig:
            decode: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(Backend.FULL, 8, [1, 2, 4, 8]))
            prefill: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(Backend.BREAKABLE, None,
                                                                                          [16, 32]))
    """,
    "sglang.srt.server_args": """
        import dataclasses
        from typing import Any, List, Optional

        from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig

        @dataclasses.dataclass
        class ServerArgs:
            model_path: str = "/models/tiny-qwen3"
            revision: Optional[str] = None
            dtype: str = "auto"
            quantization: Optional[str] = None
            context_length: Optional[int] = 2048
            load_format: str = "dummy"
            attention_backend: Optional[str] = "triton"
            sampling_backend: Optional[str] = "pytorch"
            mem_fraction_static: Optional[float] = 0.5
            max_running_requests: Optional[int] = 8
            page_size: int = 1
            kv_cache_dtype: str = "auto"
            chunked_prefill_size: Optional[int] = 8192
            tp_size: int = 1
            pp_size: int = 1
            dp_size: int = 1
            ep_size: int = 1
            device: str = "cuda"
            speculative_algorithm: Optional[str] = None
            enable_lora: bool = False
            lora_paths: Optional[List[str]] = None
            enable_torch_compile: bool = False
            torch_compile_max_bs: int = 32
            enable_memory_saver: bool = False
            enable_symm_mem: bool = False
            enable_return_hidden_states: bool = False
            disaggregation_mode: str = "null"
            disable_prefill_cuda_graph: bool = False
            enable_cudagraph_gc: bool = False
            cuda_graph_bs_decode: Optional[List[int]] = None
            cuda_graph_backend_decode: Optional[str] = None
            cuda_graph_bs_prefill: Optional[List[int]] = None
            cuda_graph_backend_prefill: Optional[str] = None
            cuda_graph_config: Any = None

            def __post_init__(self):
                # SGLang 0.5.17 resolves the graph config here (materialize_declarations).
                if self.cuda_graph_config is None:
                    config = CudaGraphConfig()
                    if self.cuda_graph_bs_decode:
                        config.decode.bs = list(self.cuda_graph_bs_decode)
                    if self.cuda_graph_backend_decode:
                        config.decode.backend = self.cuda_graph_backend_decode
                    if self.cuda_graph_bs_prefill:
                        config.prefill.bs = list(self.cuda_graph_bs_prefill)
                    if self.cuda_graph_backend_prefill:
                        config.prefill.backend = self.cuda_graph_backend_prefill
                    if self.disable_prefill_cuda_graph:
                        config.prefill.backend = Backend.DISABLED
                    self.cuda_graph_config = config

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--model-path", default="/models/tiny-qwen3")
                parser.add_argument("--tp-size", type=int, default=1)
                parser.add_argument("--enable-torch-compile", action="store_true")
                parser.add_argument("--disable-prefill-cuda-graph", action="store_true")
                parser.add_argument("--cuda-graph-bs-decode", type=int, nargs="+")
                parser.add_argument("--cuda-graph-backend-prefill")

            @classmethod
            def from_cli_args(cls, args):
                names = [f.name for f in dataclasses.fields(cls) if hasattr(args, f.name)]
                return cls(**{n: getattr(args, n) for n in names})
    """,
    "sglang.srt.distributed.bootstrap": """
        import types

        from sglang import LOG

        def init_distributed_environment(**kwargs):
            LOG.append("nccl")

        def initialize_model_parallel(**kwargs):
            LOG.append("groups")

        def _init_parallel_groups(*, backend, dist_init_method, server_args, model_config, gpu_id, tp_rank,
                                  tp_size, pp_rank, pp_size):
            init_distributed_environment(backend=backend, rank=tp_size * pp_rank + tp_rank)
            initialize_model_parallel(tensor_model_parallel_size=tp_size)

        def init_torch_distributed(*, server_args, model_config, device, ps, dist_port, is_draft_worker):
            if not is_draft_worker:
                _init_parallel_groups(backend="nccl", dist_init_method="tcp://127.0.0.1:1", server_args=server_args,
                                      model_config=model_config, gpu_id=ps.gpu_id, tp_rank=ps.tp_rank,
                                      tp_size=ps.tp_size, pp_rank=ps.pp_rank, pp_size=ps.pp_size)
            return types.SimpleNamespace(tp_group=None, pp_group=None, attention_tp_group=None,
                                         pre_model_load_memory=80.0)
    """,
    "sglang.srt.distributed.parallel_state": """
        import types

        from sglang import LOG

        def set_custom_all_reduce(enable):
            LOG.append(("custom_all_reduce", enable))

        def get_world_group():
            return types.SimpleNamespace(cpu_group="the world's gloo group")
    """,
    "sglang.srt.distributed.device_communicators.triton_symm_mem_ag": """
        class MultimemAllGatherer:
            def _build(self, x):
                return "a multimem state"
    """,
    "sglang.srt.model_executor.pool_configurator": """
        import dataclasses
        from typing import Optional

        @dataclasses.dataclass
        class MemoryPoolConfig:
            max_total_num_tokens: int
            max_running_requests: Optional[int] = None
            full_max_total_num_tokens: Optional[int] = None
            swa_max_total_num_tokens: Optional[int] = None
            mem_fraction_static: Optional[float] = None

            def __post_init__(self):
                if self.max_total_num_tokens <= 0:
                    raise RuntimeError("Not enough memory")
    """,
    "sglang.srt.mem_cache.kv_cache_configurator": """
        import types

        from sglang import KNOBS, LOG
        from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig

        class KVPool:
            def __init__(self, tokens):
                self.tokens = tokens

            def get_kv_size_bytes(self):
                half = self.tokens * KNOBS["bytes_per_token"] // 2
                return half, half

        class KVCacheConfigurator:
            def __init__(self, model_runner):
                self.server_args = model_runner.server_args
                self.is_draft_worker = model_runner.is_draft_worker
                self.mambaish_config = KNOBS.get("mamba")

            def _profile_available_bytes(self, pre_model_load_memory):
                LOG.append("profile")
                return KNOBS["free_bytes"]

            def _resolve_memory_pool_config(self, pre_model_load_memory):
                available = self._profile_available_bytes(pre_model_load_memory)
                config = MemoryPoolConfig(max_total_num_tokens=available // KNOBS["bytes_per_token"])
                config.max_running_requests = self.server_args.max_running_requests
                config.mem_fraction_static = self.server_args.mem_fraction_static
                return config

            def configure(self, *, pre_model_load_memory):
                config = self._resolve_memory_pool_config(pre_model_load_memory)
                LOG.append(("kv_pool", config.max_total_num_tokens))
                return types.SimpleNamespace(max_total_num_tokens=config.max_total_num_tokens,
                                             max_running_requests=config.max_running_requests,
                                             token_to_kv_pool=KVPool(config.max_total_num_tokens),
                                             memory_pool_config=config)
    """,
    "sglang.srt.layers.logits_processor": """
        import dataclasses
        from typing import Any, Optional

        @dataclasses.dataclass
        class LogitsProcessorOutput:
            next_token_logits: Any
            hidden_states: Optional[Any] = None
            customized_info: Optional[Any] = None
    """,
    "sglang.srt.model_executor.runner.shape_key": """
        import dataclasses
        from typing import Optional

        @dataclasses.dataclass(frozen=True)
        class ShapeKey:
            size: int
            stream_idx: Optional[int] = None
            variant_label: Optional[str] = None
    """,
    "sglang.srt.model_executor.runner.base_runner": """
        import torch

        from sglang import LOG

        class BaseRunner:
            def __init__(self, model_runner):
                self.model_runner = model_runner
                self.device_module = torch.cuda

            def warmup(self):
                mr = self.model_runner
                if getattr(mr, "_kernel_warmed_up", False):
                    return
                mr._kernel_warmed_up = True
                LOG.append("kernel_warmup")
    """,
    "sglang.srt.model_executor.runner.eager_runner": """
        from sglang import LOG
        from sglang.srt.model_executor.runner.base_runner import BaseRunner

        class EagerRunner(BaseRunner):
            def __init__(self, model_runner):
                super().__init__(model_runner)
                LOG.append("eager_buffers")
                self.warmup()
    """,
    "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend": """
        import torch

        from sglang import LOG

        class FullCudaGraphBackend:
            def __init__(self, cuda_graph_runner, *, enable_memory_saver=False):
                self._graphs = {}
                self._outputs = {}
                self._pool = None
                self._device_module = cuda_graph_runner.device_module

            def capture_one(self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
                for _ in range(2):
                    LOG.append("tp_barrier")  # self._tp_group.barrier(): meets the other ranks, in LOAD too
                    forward_fn()
                    if post_warmup_hook is not None:
                        post_warmup_hook()
                graph = torch.cuda.CUDAGraph()
                graph_ctx = self._device_module.graph
                with graph_ctx(cuda_graph=graph, pool=self._pool, stream=None):
                    out = forward_fn()
                self._graphs[shape_key] = graph
                self._outputs[shape_key] = out

            def replay(self, shape_key, static_forward_batch, **kwargs):
                self._graphs[shape_key].replay()
                return self._outputs[shape_key]

            def cleanup(self):
                for graph in self._graphs.values():
                    graph.reset()
                self._graphs.clear()
                self._outputs.clear()
    """,
    # SGLang 0.5.17's breakable CUDA graph, small: the same names, cells and call structure.
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph": """
        import logging
        from contextvars import ContextVar

        import torch

        logger = logging.getLogger(__name__)

        _current_capture_var = ContextVar("current_capture", default=None)

        def _copy_output(dst, src):
            if torch.is_tensor(dst) and torch.is_tensor(src):
                dst.copy_(src)
                return dst
            if isinstance(dst, (tuple, list)) and isinstance(src, (tuple, list)) and len(dst) == len(src):
                copied = [_copy_output(d, s) for d, s in zip(dst, src)]
                return tuple(copied) if isinstance(dst, tuple) else copied
            return src

        def eager_on_graph(enable, capture_stub=None):
            def decorator(inner):
                if not enable:
                    return inner

                def wrapper(*args, **kwargs):
                    capture = _current_capture_var.get()
                    if capture is None:
                        return inner(*args, **kwargs)
                    logger.debug("Break graph due to function: %s", inner.__name__)
                    capture._end_current_segment()
                    if capture_stub is not None:
                        output = capture_stub(*args, **kwargs)
                    else:
                        output = inner(*args, **kwargs)
                    captured_inner = inner
                    captured_args = tuple(args)
                    captured_kwargs = dict(kwargs)
                    captured_output = output

                    def replay_fn():
                        new_out = captured_inner(*captured_args, **captured_kwargs)
                        return _copy_output(captured_output, new_out)

                    capture.cuda_graph._break_fns.append(replay_fn)
                    capture._begin_new_segment()
                    return output

                return wrapper

            return decorator

        class BreakableCUDAGraph:
            def __init__(self, deduped_cuda_graph=None):
                self._segments = []
                self._break_fns = []
                self._deduped_cuda_graph = deduped_cuda_graph

            def replay(self):
                for i, seg in enumerate(self._segments):
                    seg.replay()
                    if i < len(self._break_fns):
                        self._break_fns[i]()

            def _append_segment(self, graph, needs_instantiate):
                self._segments.append(graph)

        class BreakableCUDAGraphCapture:
            def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", barrier_fn=None):
                assert isinstance(cuda_graph, BreakableCUDAGraph), "cuda_graph must be a BreakableCUDAGraph"
                self.cuda_graph = cuda_graph
                self._pool = pool if pool is not None else (0, 0)
                self._stream = stream
                self._capture_error_mode = capture_error_mode
                self._capture_token = None
                self._current_graph = None

            def __enter__(self):
                self._capture_token = _current_capture_var.set(self)
                self._begin_new_segment()
                return self

            def __exit__(self, *args):
                try:
                    self._end_current_segment()
                finally:
                    _current_capture_var.reset(self._capture_token)
                return False

            def _begin_new_segment(self):
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin(pool=self._pool, capture_error_mode=self._capture_error_mode)
                self._current_graph = graph

            def _end_current_segment(self):
                graph = self._current_graph
                assert graph is not None
                graph.capture_end()
                self.cuda_graph._append_segment(graph, False)
                self._current_graph = None

        @eager_on_graph(True)
        def break_graph():
            pass
    """,
    "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend": """
        from contextlib import contextmanager

        import torch

        from sglang import KNOBS
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
            BreakableCUDAGraph,
            BreakableCUDAGraphCapture,
        )

        class BreakableCudaGraphBackend:
            def __init__(self, cuda_graph_runner, *, enable_memory_saver=False, debug_eager=False):
                self._model_runner = cuda_graph_runner.model_runner
                self._graphs = {}
                self._outputs = {}
                self._capture_inputs = {}
                self._pool = None
                self._device_module = cuda_graph_runner.device_module
                self._capture_stream = None
                self._shared_output_buffer = None

            @contextmanager
            def capture_session(self, stream):
                if self._pool is None:
                    self._pool = ("graph_pool", 1)
                self._capture_stream = stream
                self._shared_output_buffer = None
                try:
                    yield
                finally:
                    self._capture_stream = None
                    if KNOBS.get("prefill_session_bytes"):  # what a release may allocate as the session ends
                        self._session_scratch = torch.empty((KNOBS["prefill_session_bytes"] // 2,))

            def capture_one(self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
                warmup_out = None
                for _ in range(2):
                    warmup_out = forward_fn()
                    if post_warmup_hook is not None:
                        post_warmup_hook()
                graph = BreakableCUDAGraph()
                size = shape_key.size
                if self._shared_output_buffer is None:
                    self._shared_output_buffer = warmup_out.new_empty((size, *warmup_out.shape[1:]))
                with BreakableCUDAGraphCapture(cuda_graph=graph, pool=self._pool, stream=self._capture_stream):
                    out = forward_fn()
                    out_rows = min(size, out.shape[0])
                    self._shared_output_buffer[:out_rows].copy_(out[:out_rows])
                self._graphs[shape_key] = graph
                self._outputs[shape_key] = self._shared_output_buffer[:out_rows]
                self._capture_inputs[shape_key] = capture_inputs

            def replay(self, shape_key, static_forward_batch, **kwargs):
                self._graphs[shape_key].replay()
                return self._outputs[shape_key]

            def cleanup(self):
                self._graphs.clear()
                self._outputs.clear()
                self._capture_inputs.clear()
                self._shared_output_buffer = None
    """,
    "sglang.srt.model_executor.runner_backend.utils": """
        from sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend import BreakableCudaGraphBackend
        from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

        def resolve_decode_backend(cuda_graph_runner):
            if cuda_graph_runner.model_runner.server_args.cuda_graph_config.decode.backend == "breakable":
                return BreakableCudaGraphBackend(cuda_graph_runner)
            return FullCudaGraphBackend(cuda_graph_runner)

        def resolve_prefill_backend(cuda_graph_runner):
            if cuda_graph_runner.model_runner.server_args.cuda_graph_config.prefill.backend == "full":
                return FullCudaGraphBackend(cuda_graph_runner)
            return BreakableCudaGraphBackend(cuda_graph_runner)
    """,
    "sglang.srt.model_executor.forward_context": """
        from contextlib import contextmanager
        from contextvars import ContextVar

        _forward_batch = ContextVar("forward_batch", default=None)

        @contextmanager
        def forward_context(forward_batch):
            token = _forward_batch.set(forward_batch)
            try:
                yield
            finally:
                _forward_batch.reset(token)

        def get_forward_batch():
            return _forward_batch.get()
    """,
    "sglang.srt.layers.radix_attention": """
        import torch

        from sglang import LOG
        from sglang.srt.model_executor.forward_context import get_forward_batch
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
            eager_on_graph,
        )

        def attention_with_output(query, key, value, output, save_kv_cache, layer_id):
            # Reads the batch from the forward context; its temporaries live only during the call.
            scratch = torch.empty(query.shape)
            batch = get_forward_batch()
            LOG.append(("attention", layer_id, query, key, value, output, save_kv_cache,
                        getattr(batch, "num_tokens", None), scratch.data_ptr()))

        breakable_attention = eager_on_graph(True)(attention_with_output)
    """,
    "sglang.srt.model_executor.runner.base_cuda_graph_runner": """
        import contextlib

        from sglang import LOG

        @contextlib.contextmanager
        def freeze_gc(enable_cudagraph_gc):
            LOG.append("gc.collect")
            yield
    """,
    "sglang.srt.compilation.torch_compile_decoration": """
        import contextlib
        import os

        @contextlib.contextmanager
        def patch_model(model, enable_compile, num_tokens, tp_group=None):
            if enable_compile:  # never in these tests (the fake has no compiler)
                import torch
                yield torch.compile(model.forward, mode=os.environ.get("SGLANG_TORCH_COMPILE_MODE"))
            else:
                yield model.forward
    """,
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner": """
        import types

        from sglang import LOG, FakeTensor, KNOBS
        from sglang.srt.compilation import torch_compile_decoration
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import freeze_gc
        from sglang.srt.model_executor.runner.base_runner import BaseRunner
        from sglang.srt.model_executor.runner.shape_key import ShapeKey
        from sglang.srt.model_executor.runner_backend.utils import resolve_decode_backend

        def get_batch_sizes_to_capture(model_runner, captured_req_width=1):
            sizes = list(model_runner.server_args.cuda_graph_config.decode.bs)
            limit = model_runner.max_running_requests
            return sorted({min(bs, limit) for bs in sizes}), []

        class DecodeCudaGraphRunner(BaseRunner):
            def __init__(self, model_runner):
                super().__init__(model_runner)
                self.attn_backend = model_runner.attn_backend
                self.captured_req_width = 1
                self.capture_bs, self.compile_bs = get_batch_sizes_to_capture(model_runner)
                self.max_bs = max(self.capture_bs)
                self.attn_backend.init_cuda_graph_state(self.max_bs, self.max_bs)
                # The shared logits buffer the decode graphs copy into (GraphSharedOutput).
                self.buffers = types.SimpleNamespace(logits=FakeTensor(KNOBS["logits_ptr"], (self.max_bs, 32000)))
                self.backend = resolve_decode_backend(self)
                self.capture()

            def capture(self):
                self.warmup()
                with freeze_gc(False):
                    self._capture_one_stream()

            def _capture_one_stream(self, stream_idx=None):
                for bs in reversed(self.capture_bs):
                    with torch_compile_decoration.patch_model(self.model_runner.model, bs in self.compile_bs,
                                                              num_tokens=bs) as forward:
                        self.capture_one_shape(bs, forward, stream_idx)

            def capture_prepare(self, bs):
                LOG.append(("prepare", bs))
                return types.SimpleNamespace(batch_size=bs, logits=self.buffers.logits[:bs])

            def capture_one_shape(self, size, forward, stream_idx=None, variant_label=None):
                forward_batch = self.capture_prepare(size)
                attn_backend = self.attn_backend
                attn_backend.init_forward_metadata_out_graph(forward_batch, in_capture=True)

                def run_once():
                    return forward(forward_batch)

                self.backend.capture_one(self._make_graph_key(self._capture_graph_size(bs=size, num_tokens=size),
                                                              stream_idx, variant_label),
                                         run_once, capture_inputs=None, post_warmup_hook=None)

            def _make_graph_key(self, size, stream_idx=None, variant_label=None):
                return ShapeKey(size=size, stream_idx=stream_idx, variant_label=variant_label)

            def _capture_graph_size(self, *, bs, num_tokens):
                return bs

            def execute(self, batch_size):
                bs = min(b for b in self.capture_bs if b >= batch_size)
                output = self.backend.replay(self._make_graph_key(bs), None)
                return LogitsProcessorOutput(next_token_logits=output.next_token_logits[:batch_size])
    """,
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner": """
        import types

        import torch

        from sglang import KNOBS, LOG
        from sglang.srt.model_executor.forward_context import forward_context
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import freeze_gc
        from sglang.srt.model_executor.runner.base_runner import BaseRunner
        from sglang.srt.model_executor.runner.shape_key import ShapeKey
        from sglang.srt.model_executor.runner_backend.utils import resolve_prefill_backend

        class PrefillCudaGraphRunner(BaseRunner):
            def __init__(self, model_runner):
                super().__init__(model_runner)
                prefill_config = model_runner.server_args.cuda_graph_config.prefill
                self.prefill_backend_name = prefill_config.backend
                self.capture_num_tokens = sorted(prefill_config.bs)
                self.max_num_tokens = max(self.capture_num_tokens)
                # The static input buffer every shape slices (PrefillInputBuffers).
                self.input_ids = torch.empty((self.max_num_tokens,))
                self.capture_metadata = {}
                self.backend = resolve_prefill_backend(self)
                self.capture()

            def capture(self):
                self.warmup()
                with freeze_gc(self.model_runner.server_args.enable_cudagraph_gc):
                    self.stream = "prefill_capture_stream"
                    with self.backend.capture_session(self.stream):
                        for num_tokens in reversed(self.capture_num_tokens):
                            self.capture_one_shape(num_tokens)
                    if KNOBS.get("prefill_release_inputs"):  # a release that frees a buffer after its loop
                        torch.cuda.caching_allocator_delete(self.input_ids.data_ptr())

            def capture_prepare(self, num_tokens):
                LOG.append(("prefill_prepare", num_tokens))
                forward_batch = types.SimpleNamespace(num_tokens=num_tokens, input_ids=self.input_ids[:num_tokens])
                return forward_batch, self.model_runner.attn_backend

            def capture_one_shape(self, size):
                num_tokens = size
                forward_batch, attn_backend = self.capture_prepare(num_tokens)
                # The attention metadata of this shape, made outside any graph (extend_seq_lens and the like).
                self.capture_metadata[num_tokens] = torch.empty((num_tokens + 1 + KNOBS.get("metadata_extra", 0),))
                shape_key = ShapeKey(size=num_tokens)

                def run_once():
                    with forward_context(forward_batch):
                        return self.model_runner.model.forward_extend(forward_batch)

                self.backend.capture_one(shape_key, run_once, capture_inputs=None, post_warmup_hook=None)

            def execute(self, num_tokens):
                size = min(n for n in self.capture_num_tokens if n >= num_tokens)
                with forward_context(types.SimpleNamespace(num_tokens=num_tokens)):
                    return self.backend.replay(ShapeKey(size=size), None)
    """,
    "sglang.srt.model_executor.model_runner_components.cuda_graph_setup": """
        import types

        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
        from sglang.srt.model_executor.runner.eager_runner import EagerRunner
        from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

        def capture_prefill_graph(*, model_runner, eager_runner):
            if model_runner.server_args.cuda_graph_config.prefill.backend != "breakable":
                return eager_runner
            return PrefillCudaGraphRunner(model_runner)

        def capture_cuda_graphs(*, model_runner, capture_decode_cuda_graph=True):
            eager_runner = EagerRunner(model_runner)
            # Prefill before decode, as SGLang captures them.
            prefill = capture_prefill_graph(model_runner=model_runner, eager_runner=eager_runner)
            decode = DecodeCudaGraphRunner(model_runner) if capture_decode_cuda_graph else eager_runner
            return types.SimpleNamespace(eager_runner=eager_runner, prefill=prefill, decode=decode)
    """,
    "sglang.srt.model_executor.model_runner": """
        import types

        import torch

        from sglang import LOG, FakeTensor, KNOBS
        from sglang.srt.distributed import bootstrap
        from sglang.srt.layers import radix_attention
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
        from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import capture_cuda_graphs
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
            eager_on_graph,
        )

        def rms_norm(hidden):
            return hidden

        class FakeModel:
            def forward(self, forward_batch):
                LOG.append(("forward", forward_batch.batch_size))
                return LogitsProcessorOutput(next_token_logits=forward_batch.logits)

            def forward_extend(self, forward_batch):
                # The layers a prefill graph captures: two attention calls, run eagerly between segments.
                n = forward_batch.num_tokens
                LOG.append(("prefill_forward", n))
                hidden = torch.empty((n, 64))
                for layer_id in range(2):
                    q, k, v = torch.empty((n, 64)), torch.empty((n, 8)), torch.empty((n, 8))
                    out = torch.empty((n, 64))
                    radix_attention.breakable_attention(q, k, v, out, True, layer_id)
                    hidden = out
                if KNOBS.get("local_break"):  # an eager call no module attribute holds decorated
                    eager_on_graph(True)(rms_norm)(hidden)
                return hidden

        class TritonAttnBackend:
            def init_cuda_graph_state(self, max_bs, max_num_tokens):
                self.cuda_graph_kv_indptr = FakeTensor(KNOBS["metadata_ptr"], (max_bs + 1,))

            def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
                self.forward_metadata = types.SimpleNamespace(
                    kv_indptr=self.cuda_graph_kv_indptr[: forward_batch.batch_size + 1], num_kv_splits=8)

        class ModelRunner:
            def __init__(self, model_config, mem_fraction_static, gpu_id, ps, nccl_port, server_args,
                         is_draft_worker=False):
                self.model_config = model_config
                self.server_args = server_args
                self.ps = ps
                self.is_draft_worker = is_draft_worker
                LOG.append("set_device")
                self.init_torch_distributed()
                self.model = FakeModel()
                LOG.append("load_model")

            def init_torch_distributed(self):
                result = bootstrap.init_torch_distributed(
                    server_args=self.server_args, model_config=self.model_config, device="cuda", ps=self.ps,
                    dist_port=1, is_draft_worker=self.is_draft_worker)
                self.tp_group = result.tp_group
                self.pp_group = result.pp_group
                self.attention_tp_group = result.attention_tp_group
                self.pre_model_load_memory = result.pre_model_load_memory

            def alloc_memory_pool(self, memory_pool_config=None):
                self.kv_cache_configurator = KVCacheConfigurator(self)
                result = self.kv_cache_configurator.configure(pre_model_load_memory=self.pre_model_load_memory)
                self.max_total_num_tokens = result.max_total_num_tokens
                self.max_running_requests = result.max_running_requests
                self.token_to_kv_pool = result.token_to_kv_pool
                self.memory_pool_config = result.memory_pool_config

            def post_capture_resize_kv_pool(self):
                LOG.append("post_capture_resize")

            def init_attention_backends(self):
                self.attn_backend = TritonAttnBackend()

            def init_cuda_graphs(self, capture_decode_cuda_graph=True):
                capture = capture_cuda_graphs(model_runner=self, capture_decode_cuda_graph=capture_decode_cuda_graph)
                self.eager_runner = capture.eager_runner
                self.prefill_cuda_graph_runner = capture.prefill
                self.decode_cuda_graph_runner = capture.decode

        def start_scheduler(server_args):
            # Scheduler.__init__'s order: model worker (NCCL, weights), KV pools, attention, graphs.
            ps = types.SimpleNamespace(gpu_id=0, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, dp_rank=None)
            model_config = types.SimpleNamespace(context_len=2048, dtype="bfloat16", hf_config=KNOBS["hf_config"])
            runner = ModelRunner(model_config, 0.5, 0, ps, 1, server_args)
            runner.alloc_memory_pool()
            runner.init_attention_backends()
            runner.init_cuda_graphs()
            if KNOBS.get("post_capture_resize"):
                runner.post_capture_resize_kv_pool()
            return runner
    """,
    "sglang.srt.managers.scheduler": """
        from sglang.srt.plugins import load_plugins

        def run_scheduler_process(server_args, port_args, gpu_id, tp_rank=0, pp_rank=0, dp_rank=None,
                                  pipe_writer=None):
            load_plugins()

        def run_detokenizer_process(server_args, port_args):
            load_plugins()
    """,
    "sglang.srt.entrypoints.engine": """
        import multiprocessing as mp

        def _set_envs_and_config(server_args):
            mp.set_start_method("spawn", force=True)

        def _launch_subprocesses(server_args):
            _set_envs_and_config(server_args)

        class Engine:
            @classmethod
            def _launch_scheduler_processes(cls, server_args, port_args, run_scheduler_process_func):
                proc = mp.Process(target=run_scheduler_process_func, args=(server_args, port_args))
                return proc, type(mp).__name__

            @classmethod
            def _launch_detokenizer_subprocesses(cls, server_args, port_args, run_detokenizer_process_func):
                proc = mp.Process(target=run_detokenizer_process_func, args=(server_args, port_args))
                return proc, type(mp).__name__
    """,
}


class FakeCUDAGraph:
    """torch.cuda.CUDAGraph: replays log their graph."""

    def __init__(self, keep_graph=False):
        self.keep_graph = keep_graph
        self.resets = 0

    def replay(self):
        sys.modules["sglang"].LOG.append(("replay", type(self).__name__))

    def reset(self):
        self.resets += 1

    def capture_begin(self, pool=None, capture_error_mode="global"):
        sys.modules["sglang"].LOG.append(("segment_begin", type(self).__name__))
        self._register("default generator")

    def _register(self, generator):
        """PyTorch allocates the generator's graph-safe seed and offset when a first graph registers."""
        root = sys.modules["sglang"]
        if not getattr(root, "RNG_REGISTERED", False):
            root.RNG_REGISTERED = True
            root.LOG.append(("rng_state", generator))
            root.MEMORY.alloc(RNG_STATE)

    def capture_end(self):
        sys.modules["sglang"].LOG.append(("segment_end", type(self).__name__))

    def register_generator_state(self, generator):
        self._register(generator)


class KeepGraph(FakeCUDAGraph):
    """foundry_core.cuda_graph.CUDAGraph: keeps its CUgraph."""

    def __init__(self, keep_graph=True):
        super().__init__(keep_graph)


class FakeGraphContext:
    """torch.cuda.graph: logs that a capture ran."""

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.graph = cuda_graph

    def __enter__(self):
        sys.modules["sglang"].LOG.append(("capture", type(self.graph).__name__))

    def __exit__(self, *exc):
        return False


BLAS_WORKSPACE = 1 << 20
RNG_STATE = 2 << 10


def fake_blas_handle():
    """torch.cuda.current_blas_handle: logs that PyTorch made the current stream's cuBLAS workspace
    (and allocates it: each capture loop runs on a stream of its own)."""
    sys.modules["sglang"].LOG.append("blas_handle")
    sys.modules["sglang"].MEMORY.alloc(BLAS_WORKSPACE)
    return 1


@pytest.fixture
def fake_torch(monkeypatch):
    torch = install_fake_torch(monkeypatch, FakeCUDAGraph, FakeGraphContext, KeepGraph)
    torch.cuda.current_blas_handle = fake_blas_handle
    torch.cuda.default_generators = ("generator 0",)
    torch.cuda.current_device = lambda: 0
    torch.empty = fake_empty
    torch.cuda.caching_allocator_delete = lambda ptr: sys.modules["sglang"].MEMORY.free(ptr)
    torch.is_tensor = lambda obj: isinstance(obj, FakeTensor)
    return torch


HF_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 8}


@pytest.fixture
def fake_sglang(monkeypatch, fake_torch):
    """Installs the fake SGLang modules; returns {module name: module} plus the package's LOG and
    KNOBS (what the fake engine measures: free memory, KV bytes per token, addresses)."""
    install_fake_packages(monkeypatch, FAKE_SOURCES)
    root = sys.modules["sglang"]
    root.LOG = []  # type: ignore[attr-defined]
    root.FakeTensor = FakeTensor  # type: ignore[attr-defined]
    root.KNOBS = {"free_bytes": 64 << 20, "bytes_per_token": 16 << 10, "metadata_ptr": 0x5000,  # type: ignore
                  "logits_ptr": 0x9000, "hf_config": dict(HF_CONFIG)}
    root.__version__ = "0.5.17"  # type: ignore[attr-defined]
    root.MEMORY = FakeMemory()  # type: ignore[attr-defined]  # no region: what the scheduler fixture sets
    mods = exec_fake_modules(monkeypatch, FAKE_SOURCES)
    mods["LOG"], mods["KNOBS"] = root.LOG, root.KNOBS  # type: ignore[attr-defined]
    monkeypatch.setattr(patching, "sglang_version", lambda: "0.0.fake")
    return mods


# ---- register ----------------------------------------------------------------------------------


@pytest.fixture
def recorded_activation(monkeypatch):
    return PLUGIN.record_activation(monkeypatch, "hosts_scheduler")


def test_register_off_only_adds_the_flags(fake_sglang, recorded_activation):
    PLUGIN.check_register_off_only_adds_flags(register_mod.register, recorded_activation,
                                              fake_sglang["sglang.srt.server_args"].ServerArgs,
                                              "FOUNDRY_STRICT")


def test_register_from_environment_prepares_children_once(fake_sglang, recorded_activation, monkeypatch, tmp_path):
    monkeypatch.setattr(activation, "prepare_child_environment", fake_child_env)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    register_mod.register()
    register_mod.register()
    register_mod.activate(register_mod.resolve_settings())
    assert recorded_activation == {"worker": 1, "capture": 1}
    assert os.environ["LD_PRELOAD"] == "/opt/foundry/libfoundry.so" and os.environ["FOUNDRY_STRICT"] == "1"
    assert os.environ["FOUNDRY_ARCHIVE"] == str(tmp_path) and os.environ["FOUNDRY_MODE"] == "auto"


def test_main_process_sets_the_environment_but_installs_no_worker_seams(fake_sglang, recorded_activation,
                                                                         monkeypatch, tmp_path):
    monkeypatch.setattr(activation, "hosts_scheduler", lambda: False)
    monkeypatch.setattr(activation, "prepare_child_environment", fake_child_env)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    register_mod.register()
    assert recorded_activation == {"worker": 0, "capture": 0} and os.environ["LD_PRELOAD"]


def test_scheduler_processes_are_told_apart_by_their_spawn_target(fake_sglang, monkeypatch):
    sched = fake_sglang["sglang.srt.managers.scheduler"]
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    assert not register_mod.hosts_scheduler()  # the main process never runs a scheduler
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    for target, expected in ((sched.run_scheduler_process, True), (sched.run_detokenizer_process, False), (None, True)):
        monkeypatch.setattr(multiprocessing, "current_process", lambda t=target: types.SimpleNamespace(_target=t))
        assert register_mod.hosts_scheduler() is expected, target


def test_forked_children_are_told_apart_through_their_environment_target(fake_sglang, monkeypatch):
    from foundry_core.engine.fork_server.client import InEnviron

    sched = fake_sglang["sglang.srt.managers.scheduler"]
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    for target, expected in ((sched.run_scheduler_process, True), (sched.run_detokenizer_process, False)):
        wrapped = InEnviron({}, target)
        monkeypatch.setattr(multiprocessing, "current_process", lambda t=wrapped: types.SimpleNamespace(_target=t))
        assert register_mod.hosts_scheduler() is expected, target


@pytest.mark.parametrize("server_running", [True, False])
def test_the_main_process_forks_its_children_only_with_a_fork_server(fake_sglang, recorded_activation, monkeypatch,
                                                                     tmp_path, server_running):
    from foundry_core.engine.fork_server import client

    state = client._State()
    if server_running:
        state.started(str(tmp_path / "status.json"), os.environ.get("LD_PRELOAD", ""), "SGLang", {})
    monkeypatch.setattr(client, "_STATE", state)
    monkeypatch.setattr(activation, "hosts_scheduler", lambda: False)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    monkeypatch.setattr(activation, "prepare_child_environment", fake_child_env)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    register_mod.register()
    engine = fake_sglang["sglang.srt.entrypoints.engine"]
    plain = engine.mp
    for launch in (engine.Engine._launch_scheduler_processes, engine.Engine._launch_detokenizer_subprocesses):
        proc, view = launch(None, None, print)
        assert isinstance(proc, client.ForkedProcess) is server_running
        assert (view == "ForkingMultiprocessing") is server_running
        assert engine.mp is plain  # only for the call
    assert recorded_activation == {"worker": 0, "capture": 0}


def test_register_keeps_a_users_strict_setting_and_mode_off(fake_sglang, recorded_activation, monkeypatch, tmp_path):
    PLUGIN.check_strict_setting_and_mode_off(recorded_activation, monkeypatch, tmp_path)


def test_register_with_the_real_child_environment(fake_sglang, recorded_activation, monkeypatch, tmp_path):
    PLUGIN.check_real_child_environment(monkeypatch, tmp_path)


def _missing_library(**_kw):
    raise FileNotFoundError("libfoundry.so")


def test_a_scheduler_that_cannot_activate_exits_instead_of_starting_without_foundry(fake_sglang, recorded_activation,
                                                                                    monkeypatch, tmp_path):
    # SGLang's load_plugins() swallows a plugin's exceptions; SystemExit is not one of them.
    monkeypatch.setattr(activation, "prepare_child_environment", _missing_library)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    with pytest.raises(SystemExit) as err:
        register_mod.register()
    assert "libfoundry.so was not found" in str(err.value) and "--foundry-mode off" in str(err.value)


def test_the_main_process_raises_the_activation_error(fake_sglang, recorded_activation, monkeypatch, tmp_path):
    monkeypatch.setattr(activation, "hosts_scheduler", lambda: False)
    monkeypatch.setattr(activation, "prepare_child_environment", _missing_library)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    with pytest.raises(StateError, match="--foundry-mode off"):
        register_mod.register()


def test_register_rejects_a_bad_mode(fake_sglang, recorded_activation, monkeypatch):
    monkeypatch.setattr(activation, "hosts_scheduler", lambda: False)
    monkeypatch.setenv("FOUNDRY_MODE", "restore")
    with pytest.raises(InvalidArgumentError, match="FOUNDRY_MODE"):
        register_mod.register()


def test_register_survives_moved_cli_seams(monkeypatch, recorded_activation, caplog):
    install_fake_packages(monkeypatch, ["sglang.srt.server_args"])
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", types.ModuleType("sglang.srt.server_args"))
    register_mod.register()
    assert "cli.add_cli_args" in caplog.text and "FOUNDRY_ARCHIVE" in caplog.text


# ---- CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def activations(monkeypatch):
    return PLUGIN.record_activations(monkeypatch)


def _parse(fake_sglang, argv):
    server_args = fake_sglang["sglang.srt.server_args"].ServerArgs
    parser = argparse.ArgumentParser()
    server_args.add_cli_args(parser)
    return server_args.from_cli_args(parser.parse_args(argv))


def test_cli_flags_reach_the_environment(fake_sglang, activations, tmp_path):
    cli.install(strict=True)
    server_args = _parse(fake_sglang, ["--model-path", "m", "--disable-prefill-cuda-graph", "--foundry-archive",
                                       str(tmp_path / "a"), "--foundry-mode", "save"])
    assert type(server_args).__name__ == "ServerArgs" and server_args.model_path == "m"
    assert not hasattr(server_args, "foundry_archive")  # from_cli_args copies ServerArgs fields only
    assert os.environ["FOUNDRY_ARCHIVE"] == str(tmp_path / "a") and os.environ["FOUNDRY_MODE"] == "save"
    assert [s.mode for s in activations] == [Mode.SAVE] and activations[0].archive == tmp_path / "a"


def test_cli_relative_archive_becomes_absolute(fake_sglang, activations, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cli.install(strict=True)
    _parse(fake_sglang, ["--disable-prefill-cuda-graph", "--foundry-archive", "rel"])
    assert os.environ["FOUNDRY_ARCHIVE"] == str(tmp_path / "rel") and os.environ["FOUNDRY_MODE"] == "auto"


def test_cli_without_flags_leaves_the_environment(fake_sglang, activations):
    cli.install(strict=True)
    _parse(fake_sglang, ["--enable-torch-compile"])  # unsupported, but Foundry is not asked for
    assert "FOUNDRY_MODE" not in os.environ and not activations


def test_cli_mode_off_is_exported_without_activation(fake_sglang, activations, monkeypatch, tmp_path):
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    cli.install(strict=True)
    _parse(fake_sglang, ["--foundry-mode", "off"])
    assert os.environ["FOUNDRY_MODE"] == "off" and not activations


def test_cli_load_without_archive_is_an_error(fake_sglang, activations):
    cli.install(strict=True)
    with pytest.raises(InvalidArgumentError, match="--foundry-archive"):
        _parse(fake_sglang, ["--foundry-mode", "load"])


def test_cli_refuses_unsupported_settings_in_the_main_process(fake_sglang, activations, tmp_path):
    cli.install(strict=True)
    with pytest.raises(modes.UnsupportedConfigError) as err:
        _parse(fake_sglang, ["--tp-size", "2", "--enable-torch-compile", "--cuda-graph-backend-prefill", "full",
                             "--foundry-archive", str(tmp_path)])
    text = str(err.value)
    assert "tp_size=2" in text and modes.PREFILL_FLAG in text
    assert "--enable-torch-compile" not in text  # supported
    assert "prefill CUDA-graph backend 'full' is not supported" in text
    assert "--foundry-mode off" in text and not activations  # refused before the children's environment


def test_cli_rejects_unknown_modes_and_adds_flags_once(fake_sglang, capsys):
    PLUGIN.check_cli_flags_added_once(fake_sglang["sglang.srt.server_args"].ServerArgs, capsys)


def test_cli_seam_with_the_wrong_shape_is_refused(monkeypatch):
    PLUGIN.check_wrong_shape_cli_seam(monkeypatch, "sglang.srt.server_args", "ServerArgs", "sglang_version")


# ---- modes -------------------------------------------------------------------------------------


def _server_args(fake_sglang, **fields):
    fields.setdefault("disable_prefill_cuda_graph", True)
    fields.setdefault("cuda_graph_bs_decode", [1, 2, 4, 8])
    return fake_sglang["sglang.srt.server_args"].ServerArgs(**fields)


def test_modes_accept_the_supported_configuration(fake_sglang):
    assert modes.unsupported_settings(_server_args(fake_sglang), environ={}) == []
    assert modes.graph_backends(_server_args(fake_sglang)) == ("full", "disabled")
    # SGLang's default prefill graphs (the breakable backend): supported unless the switch turns them off.
    default_prefill = _server_args(fake_sglang, disable_prefill_cuda_graph=False)
    assert modes.unsupported_settings(default_prefill, environ={}) == []
    assert modes.graph_backends(default_prefill) == ("full", "breakable")
    (problem,) = modes.unsupported_settings(default_prefill, environ={"FOUNDRY_SGLANG_PREFILL_GRAPHS": "0"})
    assert "FOUNDRY_SGLANG_PREFILL_GRAPHS=0" in problem and modes.PREFILL_FLAG in problem


def test_torch_compile_is_supported_unless_switched_off_and_never_with_cudagraph_trees(fake_sglang):
    compiled = _server_args(fake_sglang, enable_torch_compile=True)
    (problem,) = modes.unsupported_settings(compiled, environ={"FOUNDRY_SGLANG_TORCH_COMPILE": "0"})
    assert "--enable-torch-compile" in problem and "FOUNDRY_SGLANG_TORCH_COMPILE=0" in problem
    on: dict[str, str] = {}  # the default
    assert modes.unsupported_settings(compiled, environ=on) == []
    for mode in modes.COMPILE_MODES:
        assert modes.unsupported_settings(compiled, environ={**on, "SGLANG_TORCH_COMPILE_MODE": mode}) == [], mode
    for mode, why in (("reduce-overhead", "CUDA-graph trees"), ("max-autotune", "CUDA-graph trees"),
                      ("fastest", "not a torch.compile mode")):
        (problem,) = modes.unsupported_settings(compiled, environ={**on, "SGLANG_TORCH_COMPILE_MODE": mode})
        assert f"SGLANG_TORCH_COMPILE_MODE={mode}" in problem and why in problem, problem
    (problem,) = modes.unsupported_settings(compiled, environ={**on, "TORCHINDUCTOR_CUDAGRAPHS": "1"})
    assert problem.startswith("TORCHINDUCTOR_CUDAGRAPHS=1")
    # Without the flag the compile settings do not matter.
    uncompiled = _server_args(fake_sglang)
    assert modes.unsupported_settings(uncompiled, environ={"SGLANG_TORCH_COMPILE_MODE": "reduce-overhead"}) == []


def test_modes_list_every_problem_at_once(fake_sglang):
    sa = _server_args(fake_sglang, disable_prefill_cuda_graph=False, tp_size=2, dp_size=2, enable_torch_compile=True,
                      enable_memory_saver=True, speculative_algorithm="EAGLE", enable_lora=True, enable_symm_mem=True,
                      enable_return_hidden_states=True, disaggregation_mode="decode",
                      cuda_graph_backend_decode="breakable", cuda_graph_backend_prefill="tc_piecewise")
    problems = modes.unsupported_settings(sa, environ={"FOUNDRY_SGLANG_TORCH_COMPILE": "0",
                                                       "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "true",
                                                       "SGLANG_ENABLE_CUDA_GRAPH_DEDUP": "1",
                                                       "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "NVLINK"})
    text = "\n".join(problems)
    for needle in ("prefill CUDA-graph backend 'tc_piecewise' is not supported: torch.compile pieces",
                   "--disable-prefill-cuda-graph", "decode CUDA-graph backend 'breakable' is not supported",
                   "tp_size=2", "dp_size=2", "--enable-torch-compile", "--enable-memory-saver",
                   "--speculative-algorithm EAGLE", "--enable-lora", "--enable-symm-mem",
                   "--enable-return-hidden-states", "--disaggregation-mode decode",
                   "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=true", "SGLANG_ENABLE_CUDA_GRAPH_DEDUP=1",
                   "SGLANG_MOONCAKE_CUSTOM_MEM_POOL"):
        assert needle in text, needle
    assert len(problems) == 14
    with pytest.raises(modes.UnsupportedConfigError, match="Or start SGLang with --foundry-mode off"):
        modes.check_supported(sa, environ={})


def test_modes_read_the_raw_flags_of_an_unresolved_config():
    raw = types.SimpleNamespace(cuda_graph_config=None, disable_prefill_cuda_graph=True,
                                cuda_graph_backend_decode=None)
    assert modes.graph_backends(raw) == (None, "disabled")
    assert modes.unsupported_settings(raw, environ={}) == []
    disabled = types.SimpleNamespace(cuda_graph_config={"decode": {"backend": "disabled"},
                                                        "prefill": {"backend": "disabled"}})
    assert any("nothing to save" in p for p in modes.unsupported_settings(disabled, environ={}))
    default_prefill = types.SimpleNamespace(cuda_graph_config=None)  # SGLang's default: breakable
    assert modes.graph_backends(default_prefill) == (None, None)
    assert modes.unsupported_settings(default_prefill, environ={}) == []
    turned_off = modes.unsupported_settings(default_prefill, environ={"FOUNDRY_SGLANG_PREFILL_GRAPHS": "0"})
    assert "the default backend" in turned_off[0]
    for backend in ("breakable", "disabled"):
        raw = types.SimpleNamespace(cuda_graph_config=None, cuda_graph_backend_prefill=backend)
        assert modes.unsupported_settings(raw, environ={}) == [], backend
    for backend, why in (("full", "monolithic graph"), ("tc_piecewise", "torch.compile pieces")):
        raw = types.SimpleNamespace(cuda_graph_config=None, cuda_graph_backend_prefill=backend)
        (problem,) = modes.unsupported_settings(raw, environ={})
        assert f"prefill CUDA-graph backend {backend!r} is not supported" in problem and why in problem
        assert modes.PREFILL_FLAG in problem


# ---- adapter -----------------------------------------------------------------------------------


def fingerprint(server_args, model_config=None, environ=None) -> dict:
    adapter = adapter_mod.SglangAdapter(server_args, model_config, engine_version="0.5.17", environ=environ or {})
    return session_fingerprint(adapter)


def test_adapter_fingerprint_fields(fake_sglang):
    mc = types.SimpleNamespace(context_len=2048, dtype="torch.bfloat16", hf_config=dict(HF_CONFIG))
    fp = fingerprint(_server_args(fake_sglang), mc)
    assert fp["engine.name"] == "sglang" and fp["engine.version"] == "0.5.17"
    assert fp["engine.capture_sizes"] == [8, 4, 2, 1]  # SGLang captures the largest first
    assert fp["engine.dtype"] == "bfloat16" and fp["engine.tp"] == 1 and fp["engine.world_size"] == 1
    assert fp["engine.knob.attention_backend"] == "triton" and fp["engine.knob.sampling_backend"] == "pytorch"
    assert fp["engine.knob.mem_fraction_static"] == 0.5 and fp["engine.knob.warmup_forwards"] == "paused"
    assert '"prefill":{"backend":"disabled"' in fp["engine.knob.cuda_graph_config"]


def test_adapter_model_hash_follows_the_model(fake_sglang):
    mc = types.SimpleNamespace(context_len=2048, dtype="bfloat16", hf_config=dict(HF_CONFIG))
    base = fingerprint(_server_args(fake_sglang), mc)["engine.model_hash"]
    assert fingerprint(_server_args(fake_sglang), mc)["engine.model_hash"] == base
    deeper = types.SimpleNamespace(context_len=2048, dtype="bfloat16", hf_config={**HF_CONFIG, "num_hidden_layers": 9})
    assert fingerprint(_server_args(fake_sglang), deeper)["engine.model_hash"] != base
    assert fingerprint(_server_args(fake_sglang, load_format="safetensors"), mc)["engine.model_hash"] != base
    # Settings outside the model identity have their own field, so a mismatch names them.
    other = fingerprint(_server_args(fake_sglang, mem_fraction_static=0.8), mc)
    assert other["engine.model_hash"] == base and other["engine.knob.mem_fraction_static"] == 0.8


def test_adapter_knobs_include_the_kernel_environment(fake_sglang):
    fp = fingerprint(_server_args(fake_sglang), environ={"SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "1",
                                                         "SGLANG_RUN_ID": "random-per-start", "HOME": "/root",
                                                         "FOUNDRY_SGLANG_WARMUP_FORWARDS": "region"})
    assert fp["engine.knob.env"] == '{"SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS":"1"}'
    assert fp["engine.knob.warmup_forwards"] == "region"


def test_a_compiled_start_fingerprints_its_compile_settings(fake_sglang):
    plain_fp = fingerprint(_server_args(fake_sglang))
    assert not any("torch_compile" in key for key in plain_fp)  # earlier archives keep their fingerprint
    # A compiled start's own field, so that a LOAD against an uncompiled archive (or the reverse) names it.
    environ = {"TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "TRITON", "TORCHINDUCTOR_CACHE_DIR": "/tmp/x",
               "TORCHINDUCTOR_COMPILE_THREADS": "8", "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    fp = fingerprint(_server_args(fake_sglang, enable_torch_compile=True, torch_compile_max_bs=16), environ=environ)
    assert json.loads(fp["engine.knob.torch_compile"]) == {
        "max_bs": 16, "inductor_env": {"TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "TRITON"}}  # not the host's caches
    other = fingerprint(_server_args(fake_sglang, enable_torch_compile=True, torch_compile_max_bs=8), environ=environ)
    assert other["engine.knob.torch_compile"] != fp["engine.knob.torch_compile"]


def test_adapter_record_state_needs_the_kv_pool(fake_sglang):
    adapter = adapter_mod.SglangAdapter(_server_args(fake_sglang), engine_version="0.5.17")
    assert adapter.foundry_record_state() is None
    adapter.state.update(kv_cache_bytes=1 << 30, kv_cache_blocks=4096, graphs=["g"])
    assert adapter.foundry_record_state() == {"kv_cache_bytes": 1 << 30, "kv_cache_blocks": 4096, "graphs": ["g"]}


def test_adapter_plain_values_are_stable():
    class Opaque:
        pass

    @dataclasses.dataclass
    class Phase:
        backend: str = "full"
        bs: tuple = (1, 2)

    assert adapter_mod.plain(Phase()) == {"backend": "full", "bs": [1, 2]}
    assert adapter_mod.plain({"a": {2, 1}}) == {"a": [1, 2]}
    assert adapter_mod.plain(Opaque()) == "Opaque"  # no address in the fingerprint
    assert adapter_mod.plain(float("inf")) == "inf"


# ---- seams, patching, contract ----------------------------------------------------------------


def test_seam_list_is_the_single_source():
    PLUGIN.check_seam_list("sglang", "sglang/srt/distributed/bootstrap.py")
    assert all(seams.seam(n).required for n in [*worker_patches.WRAPPERS, *capture_patches.WRAPPERS])


def test_patching_is_idempotent_and_reversible(fake_sglang):
    PLUGIN.check_patching_is_idempotent_and_reversible(fake_sglang["sglang.srt.server_args"].ServerArgs)


def test_patching_names_a_missing_seam(fake_sglang):
    del fake_sglang["sglang.srt.distributed.bootstrap"]._init_parallel_groups
    with pytest.raises(patching.SeamError) as err:
        worker_patches.install()
    text = str(err.value)
    assert "'worker.parallel_groups'" in text and "sglang.srt.distributed.bootstrap._init_parallel_groups" in text
    assert "0.0.fake" in text and "0.5.17" in text and "--foundry-mode off" in text


def test_patching_refuses_changed_parameters(fake_sglang):
    fake_sglang["sglang.srt.distributed.bootstrap"]._init_parallel_groups = lambda *, backend, server_args: None
    with pytest.raises(patching.SeamError, match=r"expected parameters starting with \(backend, dist_init_method"):
        patching.install("worker.parallel_groups", worker_patches.wrap_parallel_groups)


def test_import_checker_accepts_the_fake_sglang_and_rejects_changes(fake_sglang):
    faked = [s for s in seams.SEAMS if s.module in fake_sglang]
    assert len(faked) >= 20
    assert {s.name: contract.check_import(s) for s in faked} == {s.name: None for s in faked}
    backend = fake_sglang["sglang.srt.model_executor.runner_backend.full_cuda_graph_backend"].FullCudaGraphBackend
    backend.capture_one = lambda self, key, forward: None
    problem = contract.check_import(seams.seam("cg.capture_one"))
    assert problem and "expected to start with (self, shape_key, forward_fn)" in problem


def test_source_checker_on_the_fake_sources(tmp_path):
    """The fake's source, written out as a tree, passes the AST contract of every seam it holds."""
    for name, source in FAKE_SOURCES.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    results = [r for r in contract.check_sources(contract.directory_reader(tmp_path)) if r.status != contract.MOVED]
    assert len(results) >= 20
    assert [f"{r.seam.name}: {r.detail}" for r in results if not r.ok] == []


# ---- outputs and helpers -------------------------------------------------------------------------


def test_outputs_flatten_and_rebuild(fake_sglang):
    lpo = fake_sglang["sglang.srt.layers.logits_processor"].LogitsProcessorOutput
    out = lpo(next_token_logits=FakeTensor(0x9000, (4, 32000)), customized_info=None)
    tensors, layout = outputs.flatten(out)
    assert tensors == (out.next_token_logits,) and layout["tensors"] == ["next_token_logits"]
    assert layout["type"] == "sglang.srt.layers.logits_processor:LogitsProcessorOutput"
    rebuilt = outputs.rebuild(layout, (FakeTensor(0x9000, (4, 32000)),))
    assert isinstance(rebuilt, lpo) and rebuilt.next_token_logits.data_ptr() == 0x9000 and rebuilt.hidden_states is None
    with pytest.raises(MismatchError, match="holds 2 output tensors"):
        outputs.rebuild(layout, (FakeTensor(1), FakeTensor(2)))
    with pytest.raises(UnsupportedError, match="customized_info is a dict"):
        outputs.flatten(lpo(next_token_logits=FakeTensor(1), customized_info={"x": [1]}))


def test_graph_names_and_addresses(fake_sglang):
    key = fake_sglang["sglang.srt.model_executor.runner.shape_key"].ShapeKey(8)
    assert capture_patches.graph_name(key) == "size=8,stream_idx=None,variant_label=None"
    meta = types.SimpleNamespace(kv_indptr=FakeTensor(0x10), cpu=types.SimpleNamespace(is_cuda=False), n=3)
    assert capture_patches.tensor_addresses(meta) == {".kv_indptr": 0x10}
    saved = {"g": {"a": 1, "b": 2}}
    assert capture_patches.address_mismatch(saved, {"g": {"a": 1, "b": 2, "c": 5}}) is None
    assert "metadata b at 0x3, at SAVE 0x2" in capture_patches.address_mismatch(saved, {"g": {"a": 1, "b": 3}})


def test_other_decode_backends_are_refused(fake_sglang):
    utils = fake_sglang["sglang.srt.model_executor.runner_backend.utils"]
    runner = types.SimpleNamespace(model_runner=None, device_module=None)
    with pytest.raises(modes.UnsupportedConfigError, match="BreakableCudaGraphBackend is not supported"):
        capture_patches.check_backend(utils.BreakableCudaGraphBackend(runner))


def test_options_are_validated(monkeypatch):
    assert options.instantiate_mode() == ("eager", 4) and options.warmup_forwards() == "paused"
    monkeypatch.setenv("FOUNDRY_SGLANG_INSTANTIATE", "later")
    with pytest.raises(InvalidArgumentError, match="FOUNDRY_SGLANG_INSTANTIATE"):
        options.instantiate_mode()
    monkeypatch.setenv("FOUNDRY_SGLANG_WARMUP_FORWARDS", "elsewhere")
    with pytest.raises(InvalidArgumentError, match="paused, region"):
        options.warmup_forwards()


# ---- runtime pauses ----------------------------------------------------------------------------


class ModeOnlySession:
    def __init__(self, mode):
        self.mode = mode

    def end(self):
        pass


def test_pause_order_nesting_and_closed_region(fake_sglang):
    dev = FakeDevice()
    rt = runtime.SchedulerRuntime(ModeOnlySession(Mode.SAVE), adapter_mod.SglangAdapter(None), dev)
    check_pause_nesting(rt, dev)
    check_pause_resumes_after_failure(rt, dev)
    check_no_pause_after_finish(rt, dev)


def test_fresh_runtime_and_lazy_instantiation_setting(fake_sglang, monkeypatch):
    rt = runtime.SchedulerRuntime(ModeOnlySession(Mode.LOAD), adapter_mod.SglangAdapter(None), FakeDevice())
    assert (rt.runner, rt.loop, rt.restored) == (None, None, 0)  # set before any seam runs
    for value, lazy in (("", False), ("lazy", True), ("background", False), ("sometimes", False)):
        monkeypatch.setenv("FOUNDRY_SGLANG_INSTANTIATE", value)
        assert rt.lazy_instantiation() is lazy


# ---- SAVE and LOAD flows over the fake SGLang ------------------------------------------------------


class FakeRestored:
    def __init__(self, name, index):
        self.name, self.index = name, index

    def replay(self, stream=None):
        sys.modules["sglang"].LOG.append(("replay", self.name))


class ArchiveIO(PluginArchiveIO):
    def __init__(self):
        super().__init__(KeepGraph, FakeRestored, lambda t: FakeTensor(t.ptr, t.shape))
        self.images_ahead = self.images_loaded  # directories whose images a thread loaded ahead
        self.logs: dict[Path, list[LogEntry]] = {}  # the region log each save wrote (alloc_log.json)

    def save_graphs(self, directory, graphs, fingerprint=None):
        report = super().save_graphs(directory, graphs, fingerprint)
        self.logs[Path(directory)] = list(sys.modules["sglang"].MEMORY.log)
        return report

    def load_images(self, directory, lazy=False):
        assert threading.current_thread().name == "foundry-images-ahead"
        return super().load_images(directory, lazy)


@dataclasses.dataclass
class Run:
    log: list
    rt: runtime.SchedulerRuntime | None
    runner: Any
    dev: list
    region: FakeRuntime
    memory: FakeMemory

    def steps(self) -> list[str]:
        return [e for e in self.log if isinstance(e, str)]

    def events(self, kind: str) -> list[tuple]:
        return [e for e in self.log if isinstance(e, tuple) and e[0] == kind]


@pytest.fixture
def scheduler(fake_sglang, monkeypatch, tmp_path):
    """Installs the worker, capture and prefill seams over the fake SGLang and returns a helper that
    runs one scheduler start-up (``start(mode, **server_args)``) under a real EngineSession, on a
    fresh FakeMemory (``Run.memory``). ``_server_args`` turns prefill graphs off unless a test asks
    for them (``disable_prefill_cuda_graph=False``)."""
    import foundry_core.graphs
    import foundry_core.images

    io = ArchiveIO()
    monkeypatch.setattr(foundry_core.graphs, "save_graphs", io.save_graphs)
    monkeypatch.setattr(foundry_core.graphs, "load_graphs", io.load_graphs)
    monkeypatch.setattr(foundry_core.graphs, "open_archive", io.open_archive)
    monkeypatch.setattr(foundry_core.images, "load_cuda_modules_and_libraries", io.load_images)
    monkeypatch.setattr(worker_patches, "preload_active", lambda: True)
    archive = tmp_path / "archive"
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(archive))
    worker_patches.install()
    capture_patches.install()
    prefill_patches.install()
    model_runner = fake_sglang["sglang.srt.model_executor.model_runner"]
    log, knobs = fake_sglang["LOG"], fake_sglang["KNOBS"]

    def start(mode, **fields) -> Run:
        log.clear()
        monkeypatch.setenv("FOUNDRY_MODE", mode)
        dev_log: list = []
        region = FakeRuntime()
        memory = FakeMemory(region)  # a fresh process's device memory
        monkeypatch.setattr(sys.modules["sglang"], "MEMORY", memory)
        monkeypatch.setattr(sys.modules["sglang"], "RNG_REGISTERED", False, raising=False)  # a fresh process's generator
        monkeypatch.setattr(runtime, "DeviceOps",
                            lambda: RegionDevice(dev_log, memory, io.logs, free=knobs.get("gpu_free", 1 << 40)))
        monkeypatch.setattr(runtime, "region_runtime", lambda: region)
        runtime.reset()
        runner = model_runner.start_scheduler(_server_args(fake_sglang, **fields))
        return Run(list(log), runtime.current(), runner, dev_log, region, memory)

    start.io = io  # type: ignore[attr-defined]
    start.archive = archive  # type: ignore[attr-defined]
    start.knobs = knobs  # type: ignore[attr-defined]
    return start


NAMES = [f"size={bs},stream_idx=None,variant_label=None" for bs in (8, 4, 2, 1)]


def test_save_flow(scheduler):
    run = scheduler("save")
    steps = run.steps()
    assert steps[:4] == ["set_device", "nccl", "groups", "load_model"]
    assert scheduler.io.images_ahead == []  # SAVE loads no archived image
    assert [c[0] for c in run.region.calls] == ["set_region", "seal", "stop"]  # NCCL in between; stop after capture
    assert "profile" in steps and "kernel_warmup" in steps
    # SGLang's own loop, largest first: prepare, two warmups and one captured forward per size.
    assert [e[1] for e in run.events("prepare")] == [8, 4, 2, 1]
    assert len(run.events("forward")) == 12 and run.events("capture") == [("capture", "KeepGraph")] * 4
    # The capture stream's cuBLAS workspace is made once, in the region, before the first (paused) warmup.
    assert steps.count("blas_handle") == 1
    assert run.log.index("blas_handle") < run.log.index(run.events("forward")[0])
    # SAVE-only work ran paused: profiling, the kernel warmup, and the 2 warmups of 4 shapes.
    assert run.dev.count("stop_region") == 10 and run.dev.count("resume_region") == 10
    state = run.rt.adapter.state
    saved = scheduler.io.saved[rank_dir(scheduler.archive, 0)]
    assert list(saved) == NAMES == state["graphs"]
    assert all(t[0].data_ptr() == 0x9000 for t in saved.values())  # the shared logits buffer
    assert state["kv_cache_blocks"] == 4096 and state["kv_cache_bytes"] == 4096 * (16 << 10)
    assert state["memory_pool_config"] == {"max_total_num_tokens": 4096, "max_running_requests": 8,
                                           "full_max_total_num_tokens": None, "swa_max_total_num_tokens": None,
                                           "mem_fraction_static": 0.5}
    assert state["capture_bs"] == [1, 2, 4, 8] and state["attention_addresses"][NAMES[0]] == {".kv_indptr": 0x5000}
    assert run.rt.saved and run.rt.phase is runtime.Phase.SERVING and not run.rt.region_open
    # The state went through engine_state.json: JSON-able, read back by the next start.
    from foundry_core.engine.state import read_state

    assert read_state(rank_dir(scheduler.archive, 0)).adapter["memory_pool_config"]["max_total_num_tokens"] == 4096


def test_load_flow_restores_instead_of_capturing(scheduler, caplog):
    save = scheduler("save")
    with caplog.at_level(logging.INFO, logger="foundry"):
        run = scheduler("auto")
    assert run.rt.mode is Mode.LOAD and run.rt.restored == 4
    # The kernel images went to the driver on a thread from the determinism boundary on.
    assert scheduler.io.images_ahead == [rank_dir(scheduler.archive, 0)]
    assert any("kernel images loaded ahead" in r.getMessage() for r in caplog.records)
    steps = run.steps()
    assert "profile" not in steps and "kernel_warmup" not in steps
    assert "gc.collect" not in steps and "gc.collect" in save.steps()  # the loop's collections: SAVE only
    assert run.events("forward") == [] and run.events("capture") == []  # no forward, no capture
    assert "blas_handle" not in steps  # the restore maps the workspace block SAVE's graphs read
    assert [e[1] for e in run.events("prepare")] == [8, 4, 2, 1]  # the per-shape preparation still ran
    assert run.events("kv_pool") == [("kv_pool", 4096)]  # the recorded pool, not a profiled one
    # LOAD mirrors SAVE's pauses, with no work inside them, and the cache flushes of the real
    # torch.cuda.graph (one per capture; SAVE's happen in torch, not counted here) and of
    # load_graphs (one; SAVE empties the cache where the loop starts).
    assert run.dev.count("stop_region") == 10 and run.dev.count("empty_cache") == 20 + 4
    assert save.dev.count("empty_cache") == 20 + 1
    backend = run.runner.decode_cuda_graph_runner.backend
    assert [capture_patches.graph_name(k) for k in backend._graphs] == NAMES
    assert all(isinstance(g, capture_patches.RestoredDecodeGraph) for g in backend._graphs.values())
    assert backend._foundry_archive is run.rt.archive
    out = run.runner.decode_cuda_graph_runner.execute(3)  # pads to the bs=4 graph, as SGLang does
    assert run_log(scheduler)[-1] == ("replay", NAMES[1])
    assert out.next_token_logits.data_ptr() == 0x9000 and out.next_token_logits.shape == (3, 32000)
    backend.cleanup()  # 0.5.23's cleanup resets every graph: restored ones accept it
    assert any("restored 4 decode graphs" in r.getMessage() for r in caplog.records)


def test_load_computes_tritons_cache_key_ahead(scheduler, monkeypatch):
    from foundry_core.engine import triton_key

    threads: list[str] = []
    module = types.ModuleType("triton.runtime.cache")
    module.triton_key = lambda: threads.append(threading.current_thread().name)
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", module)
    triton_key.reset()
    scheduler("save")
    assert threads == []  # SAVE's kernel warmup computes it, as in an unmodified start
    triton_key.reset()
    scheduler("load")
    triton_key._thread.join(5)
    triton_key.reset()
    assert threads == ["foundry-triton-key"]


def test_load_waits_for_the_key_thread_before_the_decode_loop_and_save_does_not(scheduler, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(capture_patches, "wait_triton_key",
                        lambda: calls.append(len(run_log(scheduler))) or 0.0)
    scheduler("save")
    assert calls == []
    run = scheduler("load")
    assert run.rt.restored == 4 and len(calls) == 1
    # before SGLang's loop prepared its first shape, all of which come after it
    prepared = [i for i, e in enumerate(run_log(scheduler)) if isinstance(e, tuple) and e[0] == "prepare"]
    assert len(prepared) == 4 and min(prepared) >= calls[0]


def run_log(scheduler) -> list:
    return sys.modules["sglang"].LOG


def test_load_with_graphs_captured_in_the_region(scheduler, monkeypatch):
    monkeypatch.setenv("FOUNDRY_SGLANG_WARMUP_FORWARDS", "region")
    save = scheduler("save")
    assert save.dev.count("stop_region") == 2  # profiling and the kernel warmup only
    load = scheduler("load")
    assert load.rt.restored == 4 and load.dev.count("stop_region") == 2


def _fallbacks(run):
    return run.rt.adapter.fallback_reasons


def test_missing_archive_in_explicit_load_starts_sglang_normally(scheduler):
    run = scheduler("load")
    assert run.rt.mode is Mode.OFF and "no archive" in _fallbacks(run)[0]
    assert run.region.calls == [] and run.dev == []  # no region, no pause
    assert "profile" in run.steps() and "kernel_warmup" in run.steps() and len(run.events("forward")) == 12
    assert run.events("capture") == [("capture", "FakeCUDAGraph")] * 4 and not scheduler.io.saved


def test_stale_archive_in_auto_saves_a_fresh_one_naming_the_setting(scheduler):
    scheduler("save")
    run = scheduler("auto", mem_fraction_static=0.6)
    assert run.rt.mode is Mode.SAVE and "engine.knob.mem_fraction_static" in _fallbacks(run)[0]
    assert run.rt.saved and "profile" in run.steps()


def test_load_falls_back_when_a_graph_is_missing(scheduler):
    scheduler("save")
    del scheduler.io.saved[rank_dir(scheduler.archive, 0)][NAMES[-1]]
    run = scheduler("auto")
    assert "missing ['size=1,stream_idx=None,variant_label=None']" in _fallbacks(run)[0]
    # Caught before SGLang's loop: it ran once, capturing for real, and a fresh archive was written.
    assert [e[1] for e in run.events("prepare")] == [8, 4, 2, 1] and run.rt.saved
    assert all(isinstance(g, KeepGraph) for g in run.runner.decode_cuda_graph_runner.backend._graphs.values())


def test_load_falls_back_when_attention_metadata_moved(scheduler):
    scheduler("save")
    scheduler.knobs["metadata_ptr"] = 0x5100
    run = scheduler("load")
    assert run.rt.mode is Mode.OFF and "kv_indptr at 0x5100, at SAVE 0x5000" in _fallbacks(run)[0]
    backend = run.runner.decode_cuda_graph_runner.backend
    assert all(type(g) is FakeCUDAGraph for g in backend._graphs.values()) and len(run.events("forward")) == 12
    assert len(scheduler.io.saved) == 1  # explicit load never writes


def test_load_falls_back_when_the_kv_pool_differs(scheduler):
    scheduler("save")
    scheduler.knobs["bytes_per_token"] = 8 << 10  # same token count, another KV layout
    run = scheduler("auto")
    assert "SGLang allocated a KV pool of 4096 tokens" in _fallbacks(run)[0] and run.rt.saved


def test_load_falls_back_when_the_gpu_lacks_the_kv_memory(scheduler):
    scheduler("save")
    scheduler.knobs["gpu_free"] = 1 << 20
    run = scheduler("auto")
    assert "the archive's KV cache needs" in _fallbacks(run)[0]
    assert "profile" in run.steps() and run.rt.saved  # profiled (paused) and saved afresh


def test_unsupported_configuration_is_refused_before_nccl(scheduler, monkeypatch):
    monkeypatch.setenv("FOUNDRY_SGLANG_TORCH_COMPILE", "0")
    with pytest.raises(modes.UnsupportedConfigError) as err:
        scheduler("save", disable_prefill_cuda_graph=False, cuda_graph_backend_prefill="full",
                  enable_torch_compile=True)
    assert "prefill CUDA-graph backend 'full'" in str(err.value) and modes.PREFILL_FLAG in str(err.value)
    assert "--enable-torch-compile" in str(err.value)
    assert "nccl" not in run_log(scheduler) and runtime.current() is None


def test_a_scheduler_without_the_preload_is_refused(scheduler, monkeypatch):
    monkeypatch.setattr(worker_patches, "preload_active", lambda: False)
    with pytest.raises(StateError, match="libfoundry.so is not preloaded"):
        scheduler("save")


def test_hybrid_models_and_post_capture_resize_are_refused(scheduler):
    scheduler.knobs["mamba"] = object()
    with pytest.raises(modes.UnsupportedConfigError, match="hybrid Mamba"):
        scheduler("save")
    del scheduler.knobs["mamba"]
    scheduler.knobs["post_capture_resize"] = True
    with pytest.raises(modes.UnsupportedConfigError, match="post-capture KV resizing"):
        scheduler("save")


def test_foundry_off_leaves_sglang_alone(scheduler, monkeypatch):
    run = scheduler("off")
    assert run.rt is None and run.region.calls == [] and run.dev == []
    assert "profile" in run.steps() and "kernel_warmup" in run.steps() and len(run.events("forward")) == 12
    assert run.events("capture") == [("capture", "FakeCUDAGraph")] * 4


def test_load_loop_skips_sglangs_garbage_collections(monkeypatch):
    # SGLang's decode runner module imports freeze_gc by name; LOAD's loop swaps it for a no-op there.
    collected = []

    @contextlib.contextmanager
    def freeze_gc(enable_cudagraph_gc):
        collected.append("collect")
        yield

    name = capture_patches.seams.seam("cg.freeze_gc").module
    module = types.ModuleType(name)
    module.freeze_gc = freeze_gc
    monkeypatch.setitem(sys.modules, name, module)
    with capture_patches.loop_without_gc():
        with module.freeze_gc(False):
            pass
    assert collected == []
    with module.freeze_gc(False):  # put back after the loop
        pass
    assert collected == ["collect"]
    monkeypatch.delitem(sys.modules, name)
    with capture_patches.loop_without_gc():  # no decode runner module: nothing to skip
        pass
