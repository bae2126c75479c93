"""A synthetic TensorRT-LLM written by the tests: the modules, classes and methods at the paths of
trtllm_foundry/seams.py, with bodies that follow TensorRT-LLM 1.2's control flow closely enough
for the plugin's seams to be driven without the real engine (which cannot be installed from
PyPI). Used by test_trtllm_plugin.py (SAVE / LOAD flows in this process) and test_trtllm_hook.py
(the start-up and import hooks in child processes); the tests here check that the tree satisfies
the seam table's source contract, so the flows exercise the shapes the table promises.

The tree imports only ``torch`` (a fake in the flow tests, never executed in the hook tests) and
``tensorrt_llm._fake`` (a device-address allocator and an event log the tests read).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "trtllm_foundry"
if str(PLUGIN_DIR) not in sys.path:
    try:
        import trtllm_foundry  # noqa: F401  (installed?)
    except ImportError:  # not installed: the source tree
        sys.path.insert(0, str(PLUGIN_DIR))

SOURCES: dict[str, str] = {
    "tensorrt_llm/__init__.py": """
        __version__ = "1.2.1"
    """,
    "tensorrt_llm/_fake.py": """
        # What the tests read and steer: the event log, a device-address allocator, knobs.
        # Like the deterministic region, the allocator hands out addresses in order; while the
        # region is paused (KNOBS["paused"]) allocations come from elsewhere and leave no trace, and
        # what a capture allocates comes from the graphs' private pool (which LOAD's restore maps).
        LOG = []
        KNOBS = {}
        _next = [0x10000]
        _outside = [0x7f0000000000]
        _pool = [0x600000000000]

        class Tensor:
            is_cuda = True

            def __init__(self, ptr, shape=(1,)):
                self.ptr, self.shape = ptr, tuple(shape)

            def data_ptr(self):
                return self.ptr

            def __repr__(self):
                return f"Tensor({self.ptr:#x})"

        def alloc(size=0x100, shape=(1,)):
            cursor = _outside if KNOBS.get("paused") else _pool if KNOBS.get("capturing") else _next
            ptr = cursor[0] + KNOBS.get("shift", 0)
            cursor[0] += size
            return Tensor(ptr, shape)

        def reset():
            LOG.clear()
            KNOBS.clear()
            _next[0], _outside[0], _pool[0] = 0x10000, 0x7f0000000000, 0x600000000000
    """,
    "tensorrt_llm/_torch/__init__.py": "",
    "tensorrt_llm/_torch/utils.py": """
        from tensorrt_llm import _fake

        def make_weak_ref(x):
            if isinstance(x, dict):
                return {k: make_weak_ref(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(make_weak_ref(v) for v in x)
            return None if x is None else _fake.Tensor(x.data_ptr(), x.shape)
    """,
    "tensorrt_llm/_torch/autotuner.py": """
        import contextlib
        import json
        import os

        from tensorrt_llm import _fake

        class AutoTunerProfilingCache:
            def __init__(self):
                self.cache = {}

            def load_cache(self, file_path, rank):
                self.cache.update(json.loads(open(file_path).read())[f"rank_{rank}"])
                _fake.LOG.append(("load_cache", rank))

            def save_cache(self, file_path, rank):
                with open(file_path, "w") as f:
                    f.write(json.dumps({f"rank_{rank}": self.cache}))

        class AutoTuner:
            _instance = None

            def __init__(self):
                self.profiling_cache = AutoTunerProfilingCache()
                self.is_tuning_mode = False
                self.mapping = None

            @classmethod
            def get(cls):
                if cls._instance is None:
                    cls._instance = AutoTuner()
                return cls._instance

            def setup_distributed_state(self, mapping, dist=None):
                self.mapping = mapping

        @contextlib.contextmanager
        def autotune(tune_mode=True, cache_path=None):
            tuner = AutoTuner.get()
            rank = tuner.mapping.rank
            if cache_path is not None and os.path.exists(cache_path):
                tuner.profiling_cache.load_cache(cache_path, rank)
            tuner.is_tuning_mode = tune_mode
            try:
                yield
            finally:
                tuner.is_tuning_mode = False
                if cache_path is not None:
                    tuner.profiling_cache.save_cache(cache_path, rank)
    """,
    "tensorrt_llm/_torch/pyexecutor/__init__.py": "",
    "tensorrt_llm/_torch/pyexecutor/cuda_graph_runner.py": """
        import torch

        from tensorrt_llm import _fake
        from ..utils import make_weak_ref

        class CUDAGraphRunner:
            WARMUP_STEPS = 2

            def __init__(self, config):
                self.config = config
                self.graphs = {}
                self.graph_outputs = {}
                self.graph_metadata = {}
                self.memory_pool = None
                self.shared_static_tensors = {"input_ids": _fake.alloc(), "position_ids": _fake.alloc()}

            def needs_capture(self, key):
                return key not in self.graph_outputs

            def capture(self, key, forward_fn, initial_inputs, enable_spec_decode=False, postprocess_fn=None):
                capture_inputs = dict(initial_inputs)
                capture_inputs.update(self.shared_static_tensors)
                self.graph_metadata[key] = {"attn_metadata": initial_inputs["attn_metadata"],
                                            "spec_metadata": initial_inputs.get("spec_metadata", None)}
                graph = torch.cuda.CUDAGraph()
                for _ in range(self.WARMUP_STEPS):
                    forward_fn(capture_inputs)
                with torch.cuda.graph(graph, pool=self.memory_pool):
                    output = forward_fn(capture_inputs)
                self.graphs[key] = graph
                self.graph_outputs[key] = make_weak_ref(output)
                self.memory_pool = graph.pool()

            def replay(self, key, current_inputs):
                assert current_inputs["attn_metadata"] is self.graph_metadata[key]["attn_metadata"]
                self.graphs[key].replay()
                return self.graph_outputs[key]

            def clear(self):
                for graph in self.graphs.values():
                    graph.reset()
                self.graphs.clear()
                self.graph_outputs.clear()
                self.graph_metadata.clear()
                self.memory_pool = None
    """,
    "tensorrt_llm/_torch/pyexecutor/model_engine.py": """
        import os
        import types

        from tensorrt_llm import _fake
        from ..autotuner import AutoTuner, autotune
        from .cuda_graph_runner import CUDAGraphRunner

        class PyTorchModelEngine:
            def __init__(self, *, model_path, llm_args, mapping=None, dist=None):
                _fake.LOG.append("load_weights")
                self.llm_args = llm_args
                self.mapping = mapping
                self.dist = dist
                self.weights = _fake.alloc(0x1000)
                self.cuda_graph_runner = CUDAGraphRunner(llm_args.cuda_graph_config)
                self.batch_sizes = sorted(llm_args.cuda_graph_config.batch_sizes, reverse=True)

            def warmup(self, resource_manager):
                _fake.LOG.append("warmup")
                self._run_autotuner_warmup(resource_manager)
                self._run_cuda_graph_warmup(resource_manager)

            def _run_autotuner_warmup(self, resource_manager):
                if not self.llm_args.enable_autotuner:
                    return
                AutoTuner.get().setup_distributed_state(self.mapping, self.dist)
                cache_path = os.environ.get("TLLM_AUTOTUNER_CACHE_PATH", None)
                with autotune(cache_path=cache_path):
                    _fake.LOG.append(("autotune_forward", cache_path is not None))
                    AutoTuner.get().profiling_cache.cache["gemm"] = [1, 7]

            def _run_cuda_graph_warmup(self, resource_manager):
                self._capture_generation_cuda_graphs(resource_manager)

            def _capture_generation_cuda_graphs(self, resource_manager):
                for bs in self.batch_sizes:
                    self.forward(types.SimpleNamespace(batch_size=bs))

            def forward(self, batch):
                key = (batch.batch_size, 0, False, False)
                metadata = types.SimpleNamespace(kv_lens=_fake.alloc(), block_ids=_fake.alloc())
                inputs = {"attn_metadata": metadata, "spec_metadata": None}
                runner = self.cuda_graph_runner
                if runner.needs_capture(key):
                    runner.capture(key, self._model_forward, inputs)
                out = runner.replay(key, inputs)
                _fake.LOG.append(("replayed", batch.batch_size))
                return out

            def _model_forward(self, inputs):
                _fake.LOG.append(("forward", _fake.KNOBS.get("capturing", False)))
                return {"logits": _fake.alloc(0x400, (8, 32)), "hidden": None}

            def _release_cuda_graphs(self):
                self.cuda_graph_runner.clear()
    """,
    "tensorrt_llm/_torch/pyexecutor/_util.py": """
        import enum
        import types

        from tensorrt_llm import _fake

        class ResourceManagerType(enum.Enum):
            KV_CACHE_MANAGER = "kv_cache_manager"

        class KvCacheCreator:
            def __init__(self, *, model_engine, kv_cache_config):
                self._model_engine = model_engine
                self._kv_cache_config = kv_cache_config

            def try_prepare_estimation(self):
                self._kv_cache_config.max_tokens = 256  # just enough for the dummy requests
                return True

            def configure_kv_cache_capacity(self, py_executor):
                _fake.LOG.append("profile")
                self._kv_cache_config.max_tokens = 8192
                self._kv_cache_config.max_gpu_total_bytes = 8192 * 1024

            def _create_kv_cache_manager(self, model_engine, estimating_kv_cache=False):
                tokens = self._kv_cache_config.max_tokens
                blocks = min(tokens, _fake.KNOBS.get("max_tokens_that_fit", tokens)) // 32
                buffer = _fake.alloc(blocks * 32 * 1024)
                stats = types.SimpleNamespace(max_num_blocks=blocks, allocated_bytes=blocks * 32 * 1024)
                return types.SimpleNamespace(buffer=buffer, get_kv_cache_stats=lambda: stats)

            def build_managers(self, resources, estimating_kv_cache=False):
                kv = self._create_kv_cache_manager(self._model_engine, estimating_kv_cache)
                resources[ResourceManagerType.KV_CACHE_MANAGER] = kv
                _fake.LOG.append(("build_managers", estimating_kv_cache))

            def teardown_managers(self, resources):
                resources.clear()
                _fake.LOG.append("teardown")
    """,
    "tensorrt_llm/_torch/pyexecutor/py_executor_creator.py": """
        # The order of TensorRT-LLM 1.2's create_py_executor, reduced to what the seams see.
        import types

        from tensorrt_llm import _fake
        from ._util import KvCacheCreator
        from .model_engine import PyTorchModelEngine

        def create_py_executor(llm_args, mapping):
            engine = PyTorchModelEngine(model_path=llm_args.model, llm_args=llm_args, mapping=mapping)
            creator = KvCacheCreator(model_engine=engine, kv_cache_config=llm_args.kv_cache_config)
            resources = {}
            estimating = creator.try_prepare_estimation()
            creator.build_managers(resources, estimating)
            engine.warmup(resources)  # the first executor's warmup
            if estimating:
                creator.configure_kv_cache_capacity(None)
                creator.teardown_managers(resources)
                creator.build_managers(resources, False)
                engine._release_cuda_graphs()
                engine.warmup(resources)  # the final executor's warmup
            _fake.LOG.append("serving")
            return types.SimpleNamespace(engine=engine, resources=resources)
    """,
    "tensorrt_llm/llmapi/__init__.py": "",
    "tensorrt_llm/llmapi/llm.py": """
        from tensorrt_llm import _fake

        class BaseLLM:
            def __init__(self, args):
                self.args = args
                self._executor_cls = types_executor()
                self._build_model()

            def _build_model(self):
                pass

        class _TorchLLM(BaseLLM):
            def _build_model(self):
                self._executor = self._executor_cls.create(self.args)

        def types_executor():
            import types

            return types.SimpleNamespace(create=lambda args: _fake.LOG.append("executor"))
    """,
    "tensorrt_llm/commands/__init__.py": "",
    "tensorrt_llm/commands/serve.py": """
        import click

        @click.command("serve")
        @click.argument("model", type=str)
        @click.option("--port", type=int, default=8000)
        def serve(model, port):
            from tensorrt_llm import _fake

            _fake.LOG.append(("serve", model, port))
    """,
}


def write_tree(root: Path) -> Path:
    """Writes the synthetic TensorRT-LLM under ``root`` (which then holds ``tensorrt_llm/``)."""
    for rel, text in SOURCES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


# ---- the tree keeps the seam table's promises ------------------------------------------------------


def test_the_synthetic_tree_satisfies_the_source_contract(tmp_path):
    from trtllm_foundry import contract

    results = contract.check_sources(contract.directory_reader(write_tree(tmp_path)))
    failed = [f"{r.seam.name}: {r.detail}" for r in results if not r.ok]
    assert not failed, failed
    assert len(results) == len(__import__("trtllm_foundry.seams").seams.SEAMS)


def test_the_checker_reports_a_changed_capture_and_a_moved_creator(tmp_path):
    from trtllm_foundry import contract

    write_tree(tmp_path)
    runner = tmp_path / "tensorrt_llm/_torch/pyexecutor/cuda_graph_runner.py"
    runner.write_text(runner.read_text().replace("def capture(self, key, forward_fn", "def capture(self, batch_size, forward_fn"))
    (tmp_path / "tensorrt_llm/_torch/pyexecutor/_util.py").unlink()
    results = {r.seam.name: r for r in contract.check_sources(contract.directory_reader(tmp_path))}
    assert results["runner.capture"].status == contract.CHANGED
    assert "expected to start with (self, key, forward_fn, initial_inputs)" in results["runner.capture"].detail
    assert results["kv.build"].status == contract.MOVED and "not found" in results["kv.build"].detail
    assert {r.seam.name for r in contract.blocking(results.values())} >= {"runner.capture", "kv.build"}
