"""vllm-foundry without vLLM: registration, CLI flags, adapter fingerprint, mode refusal, seam
patching, and the SAVE / LOAD flows of the worker and capture seams over a fake vLLM whose
modules have the real names and the shapes listed in vllm_foundry/seams.py."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import importlib
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest


from plugin_support import (  # noqa: E402
    FakeDevice, Plugin, check_no_pause_after_finish, check_pause_nesting, check_pause_resumes_after_failure,
    exec_fake_modules, fake_child_env, install_fake_packages, install_fake_torch, session_fingerprint)

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "vllm_foundry"
try:
    import vllm_foundry  # noqa: F401  (installed?)
except ImportError:  # not installed: test the source tree
    sys.path.insert(0, str(PLUGIN_DIR))

from foundry_core.engine import Mode  # noqa: E402
from foundry_core.errors import InvalidArgumentError, StateError  # noqa: E402
from foundry_core.graphs import LoadTimes  # noqa: E402

from vllm_foundry import adapter as adapter_mod  # noqa: E402
from vllm_foundry import (  # noqa: E402
    activation, capture_patches, cli, modes, patching, piecewise, ranks, runtime, seams, worker_patches, workspace)

register_mod = importlib.import_module("vllm_foundry.register")
_real_hosts_engine = activation.hosts_engine
PLUGIN = Plugin(register_mod, activation, runtime, patching, worker_patches, capture_patches, cli, seams)

FOUNDRY_ENV = ("FOUNDRY_ARCHIVE", "FOUNDRY_MODE", "FOUNDRY_STRICT", "FOUNDRY_FALLBACK", "FOUNDRY_VLLM_JIT_WARMUP",
               "FOUNDRY_VLLM_CHECK_METADATA", "FOUNDRY_VLLM_INSTANTIATE", "FOUNDRY_VLLM_DP_SIZE",
               "FOUNDRY_VLLM_DP_SIZE_LOCAL", "FOUNDRY_VLLM_DP_BACKEND", "LD_PRELOAD",
               "VLLM_WORKER_MULTIPROC_METHOD", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "VLLM_ENABLE_V1_MULTIPROCESSING",
               "VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_USE_STANDALONE_COMPILE", "VLLM_DISABLE_COMPILE_CACHE",
               "VLLM_USE_AOT_COMPILE", "FOUNDRY_VLLM_PIECEWISE", "FOUNDRY_VLLM_PIECE_INSTANTIATE",
               "FOUNDRY_VLLM_LOAD_WARMUPS")


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    yield from PLUGIN.isolation(monkeypatch, FOUNDRY_ENV)


# ---- a fake vLLM with the real module names -----------------------------------------------------

FAKE_SOURCES = {
    "vllm.engine.arg_utils": """
        import dataclasses

        @dataclasses.dataclass
        class EngineArgs:
            model: str = "facebook/opt-125m"
            seed: int = 0

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--model", default="facebook/opt-125m")
                parser.add_argument("--seed", type=int, default=0)
                return parser

            @classmethod
            def from_cli_args(cls, args):
                names = [f.name for f in dataclasses.fields(cls)]
                return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})

        @dataclasses.dataclass
        class AsyncEngineArgs(EngineArgs):
            enable_log_requests: bool = False

            @staticmethod
            def add_cli_args(parser, async_args_only=False):
                parser = EngineArgs.add_cli_args(parser)
                parser.add_argument("--enable-log-requests", action="store_true")
                return parser
    """,
    "vllm.v1.worker.gpu.input_batch": """
        import uuid

        def random_uuid():
            return f"{uuid.uuid4().int & (1 << 64) - 1:016x}"

        def dummy_request_ids(num_reqs):
            return [f"req_{i}_{random_uuid()}" for i in range(num_reqs)]
    """,
    "vllm.v1.worker.gpu.cudagraph_utils": """
        import dataclasses
        import enum
        import torch

        from vllm.v1.worker.gpu import input_batch

        LOG = []

        class CUDAGraphMode(enum.Enum):
            NONE = 0
            PIECEWISE = 1
            FULL = 2
            FULL_DECODE_ONLY = (2, 0)

        @dataclasses.dataclass(frozen=True)
        class BatchExecutionDescriptor:
            cg_mode: CUDAGraphMode
            num_tokens: int
            num_reqs: int | None
            uniform_token_count: int | None = None
            num_active_loras: int = 0

        class FakeTensor:
            is_cuda = True

            def __init__(self, ptr, n=8):
                self.ptr, self.n = ptr, n

            def data_ptr(self):
                return self.ptr

            def __getitem__(self, item):
                return self

        class CudaGraphManager:
            def __init__(self, vllm_config, device, cudagraph_mode, decode_query_len=1, lora_capture_cases=None):
                self.vllm_config = vllm_config
                self.cudagraph_mode = cudagraph_mode
                self.graphs = {}
                self._graphs_captured = False
                self._capture_descs = {CUDAGraphMode.FULL: [
                    BatchExecutionDescriptor(CUDAGraphMode.FULL, n, n, 1) for n in (4, 2, 1)]}

            def capture(self, create_forward_fn, progress_bar_desc="Capturing CUDA graphs"):
                attn_states = {}
                for desc in self._capture_descs[CUDAGraphMode.FULL]:
                    forward_fn, warm = create_forward_fn(desc, warmup=True)
                    forward_fn(CUDAGraphMode.NONE)
                    forward_fn, state = create_forward_fn(desc, warmup=False)
                    attn_states[desc] = (warm, state)
                    assert desc not in self.graphs
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, None):
                        forward_fn(CUDAGraphMode.NONE)
                    self.graphs[desc] = graph
                self._graphs_captured = True
                return attn_states

            def run_fullgraph(self, desc):
                self.graphs[desc].replay()

        class ModelCudaGraphManager(CudaGraphManager):
            def __init__(self, vllm_config, device, cudagraph_mode, decode_query_len=1, lora_capture_cases=None):
                super().__init__(vllm_config, device, cudagraph_mode, decode_query_len, lora_capture_cases)
                self.hidden_states = None
                self.aux_hidden_states = []
                self.use_aux_hidden_state_outputs = False

            def capture(self, model, metadata_ptr=0x5000):
                def create_forward_fn(desc, warmup):
                    LOG.append(("requests", tuple(input_batch.dummy_request_ids(2))))
                    state = ({"layer.0": types_ns(seq_lens=FakeTensor(metadata_ptr), max_len=desc.num_tokens)},
                             {"layer.0": FakeTensor(0x6000)})

                    def forward_fn(mode):
                        LOG.append(("forward", desc.num_tokens, mode.name))
                        if self.hidden_states is None:
                            self.hidden_states = FakeTensor(0x7000)

                    return forward_fn, state

                return super().capture(create_forward_fn, "Capturing")

        class types_ns:
            def __init__(self, **kw):
                self.__dict__.update(kw)
    """,
    "vllm.v1.worker.gpu.model_runner": """
        import gc

        from vllm.v1.worker.gpu.cudagraph_utils import LOG, CUDAGraphMode, ModelCudaGraphManager

        class GPUModelRunner:
            def __init__(self, vllm_config, device):
                self.vllm_config = vllm_config
                self.cudagraph_manager = None
                self.metadata_ptr = 0x5000

            def initialize_kv_cache(self, kv_cache_config):
                self.cudagraph_manager = ModelCudaGraphManager(
                    self.vllm_config, "cuda:0", self.vllm_config.compilation_config.cudagraph_mode)

            def _dummy_run(self, num_tokens, *args, skip_eplb=False, **kwargs):
                LOG.append(("dummy_run", num_tokens))
                return "hidden", "sampled"

            def capture_model(self):
                LOG.append("capture_model")
                gc.collect()
                self.cudagraph_manager.capture(None, metadata_ptr=self.metadata_ptr)
                return 123
    """,
    "vllm.v1.worker.workspace": """
        _manager = None
        PROFILE_GROWS = 0  # bytes the profile's forward grows slot 0 to (0: a dense model's, none)

        class Buffer:
            def __init__(self, size, address):
                self.size, self.address = size, address

            def numel(self):
                return self.size

            def element_size(self):
                return 1

            def data_ptr(self):
                return self.address

        class WorkspaceManager:
            def __init__(self, device, num_ubatches=None):
                self._device = device
                self._current_workspaces = [None] * (num_ubatches or 1)

        def init_workspace_manager(device, num_ubatches=None):
            global _manager
            _manager = WorkspaceManager(device, num_ubatches)

        def is_workspace_manager_initialized():
            return _manager is not None

        def current_workspace_manager():
            return _manager
    """,
    "vllm.v1.worker.gpu_worker": """
        from vllm.v1.worker.gpu.cudagraph_utils import LOG
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
        from vllm.v1.worker import workspace

        def kernel_warmup(worker):
            LOG.append("kernel_warmup")

        def warmup_kernels(model_runner, worker_execute_model, worker_sample_tokens):
            LOG.append("warmup_kernels")

        def init_worker_distributed_environment(vllm_config, rank, distributed_init_method=None, local_rank=-1,
                                                backend="nccl"):
            LOG.append("nccl")

        class Worker:
            def __init__(self, vllm_config, rank=0):
                self.vllm_config = vllm_config
                self.rank = rank
                self.use_v2_model_runner = True

            def init_device(self):
                LOG.append("set_device")
                init_worker_distributed_environment(self.vllm_config, self.rank, "tcp://x", 0, "nccl")
                workspace.init_workspace_manager("cuda:0")
                self.model_runner = GPUModelRunner(self.vllm_config, "cuda:0")

            def determine_available_memory(self):
                LOG.append("profile_run")
                if workspace.PROFILE_GROWS:  # a MoE model's profile forward grows the shared workspace
                    workspace.current_workspace_manager()._current_workspaces[0] = workspace.Buffer(
                        workspace.PROFILE_GROWS, 0x7F00_0000)
                return 1000

            def initialize_from_config(self, kv_cache_config):
                LOG.append(("kv_cache", kv_cache_config.num_blocks))
                self.model_runner.initialize_kv_cache(kv_cache_config)

            def compile_or_warm_up_model(self):
                for size in (16,):
                    self.model_runner._dummy_run(size, skip_eplb=True, remove_lora=False)
                kernel_warmup(self)
                self.model_runner.capture_model()
                warmup_kernels(self.model_runner, None, None)
                return "times"
    """,
}


class FakeCUDAGraph:
    def __new__(cls, keep_graph=False):
        return object.__new__(cls)

    def __init__(self, keep_graph=False):
        self.keep_graph = keep_graph


class FakeGraphContext:
    def __init__(self, graph, pool=None, stream=None, capture_error_mode="global"):
        self.graph = graph

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class KeepGraph(FakeCUDAGraph):
    def __new__(cls, keep_graph=True):
        return object.__new__(cls)

    def __init__(self, keep_graph=True):
        super().__init__(keep_graph)


@pytest.fixture
def fake_torch(monkeypatch):
    torch = install_fake_torch(monkeypatch, FakeCUDAGraph, FakeGraphContext, KeepGraph)
    torch.inference_mode = contextlib.nullcontext  # type: ignore[attr-defined]
    return torch


@pytest.fixture
def fake_vllm(monkeypatch, fake_torch):
    """Installs the fake vLLM modules; returns {module name: module}."""
    install_fake_packages(monkeypatch, FAKE_SOURCES)
    mods = exec_fake_modules(monkeypatch, FAKE_SOURCES)
    monkeypatch.setattr(patching, "vllm_version", lambda: "0.0.fake")
    # This fake has no piece seam: installing the seams marks the piecewise modes unavailable in
    # this process; undone after the test.
    monkeypatch.setattr(piecewise, "_unavailable", None)
    return mods


# ---- register ----------------------------------------------------------------------------------


@pytest.fixture
def recorded_activation(monkeypatch):
    return PLUGIN.record_activation(monkeypatch, "hosts_engine")


def test_register_off_only_adds_the_flags(fake_vllm, recorded_activation):
    PLUGIN.check_register_off_only_adds_flags(register_mod.register, recorded_activation,
                                              fake_vllm["vllm.engine.arg_utils"].EngineArgs,
                                              "VLLM_WORKER_MULTIPROC_METHOD")


def test_register_in_a_child_leaves_the_command_line_alone(fake_vllm, recorded_activation, monkeypatch):
    """vLLM's children (an engine core forked from the fork server, say) parse no command line:
    register() does not wrap EngineArgs there, which would import vllm.engine.arg_utils."""
    import multiprocessing

    engine_args = fake_vllm["vllm.engine.arg_utils"].EngineArgs
    before = (engine_args.add_cli_args, engine_args.from_cli_args)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    register_mod.register()
    assert (engine_args.add_cli_args, engine_args.from_cli_args) == before


def test_register_from_environment_prepares_children_once(fake_vllm, recorded_activation, monkeypatch, tmp_path):
    monkeypatch.setattr(activation, "prepare_child_environment", fake_child_env)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    register_mod.register()
    register_mod.register()
    register_mod.activate(register_mod.resolve_settings())
    assert recorded_activation == {"worker": 1, "capture": 1}
    assert os.environ["LD_PRELOAD"] == "/opt/foundry/libfoundry.so"
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert os.environ["FOUNDRY_STRICT"] == "1"
    assert os.environ["FOUNDRY_ARCHIVE"] == str(tmp_path) and os.environ["FOUNDRY_MODE"] == "auto"


@pytest.mark.parametrize("torch_version,env,expected", [
    ("2.11.0+cu130", {}, "1"),
    ("2.10.1", {}, "1"),
    ("2.9.1+cu128", {}, None),  # vLLM's standalone compile has no whole artifact before 2.10
    ("2.10.0a0+nv25.01", {}, None),  # a pre-release is older than 2.10.0 for vLLM too
    ("2.11.0", {"VLLM_USE_MEGA_AOT_ARTIFACT": "0"}, "0"),  # the user's choice stays
    ("2.11.0", {"VLLM_USE_STANDALONE_COMPILE": "0"}, None),  # vLLM requires the two together
    ("2.11.0", {"VLLM_DISABLE_COMPILE_CACHE": "1"}, None),
    ("2.11.0", {"VLLM_USE_AOT_COMPILE": "0"}, None),
    ("2.11.0", {"VLLM_USE_AOT_COMPILE": "false"}, None),  # vLLM turns AOT compile on for "1" only
    (None, {}, None),  # no torch installed: nothing to decide
])
def test_foundry_mode_loads_the_compiled_model_whole(fake_vllm, recorded_activation, monkeypatch, tmp_path, capsys,
                                                     torch_version, env, expected):
    from vllm_foundry import compile_artifact

    monkeypatch.setattr(activation, "prepare_child_environment", fake_child_env)
    monkeypatch.setattr(compile_artifact, "installed_torch_version", lambda: torch_version)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    register_mod.register()
    register_mod.activate(register_mod.resolve_settings())  # again: logged once, set once
    assert os.environ.get("VLLM_USE_MEGA_AOT_ARTIFACT") == expected
    # On the user's terminal: the plugin's log handler is set up before the line is logged.
    said = capsys.readouterr().err.count("foundry: VLLM_USE_MEGA_AOT_ARTIFACT=1 (vLLM loads")
    assert said == (1 if expected == "1" and "VLLM_USE_MEGA_AOT_ARTIFACT" not in env else 0)


def test_foundry_off_leaves_vllms_compile_settings(fake_vllm, recorded_activation, monkeypatch):
    from vllm_foundry import compile_artifact

    monkeypatch.setattr(compile_artifact, "installed_torch_version", lambda: "2.11.0")
    register_mod.register()  # no archive: Foundry is off
    assert "VLLM_USE_MEGA_AOT_ARTIFACT" not in os.environ


def test_a_preloaded_first_process_keeps_fork(fake_vllm, recorded_activation, monkeypatch, tmp_path):
    # Under `foundry run -- vllm ...` the first process has the preload, so forked children have it
    # too: no spawn (which would import vLLM a second time in the engine process).
    monkeypatch.setattr(activation, "prepare_child_environment", fake_child_env)
    monkeypatch.setattr(activation, "preload_active", lambda: True)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    hooks = []
    monkeypatch.setattr(activation, "hosts_engine", _real_hosts_engine)
    monkeypatch.setattr(activation.os, "register_at_fork", lambda after_in_child: hooks.append(after_in_child))
    register_mod.register()
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert os.environ["LD_PRELOAD"] == "/opt/foundry/libfoundry.so"
    # No seams in this process; in the forked engine process (where vLLM loads no plugin again),
    # the at-fork hook installs them.
    assert recorded_activation == {"worker": 0, "capture": 0} and len(hooks) == 1
    hooks[0]()
    assert recorded_activation == {"worker": 1, "capture": 1}


def test_first_process_sets_the_environment_but_installs_no_worker_seams(fake_vllm, recorded_activation,
                                                                          monkeypatch, tmp_path):
    monkeypatch.setattr(activation, "hosts_engine", _real_hosts_engine)
    monkeypatch.setattr(activation, "prepare_child_environment", fake_child_env)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    register_mod.register()
    assert recorded_activation == {"worker": 0, "capture": 0} and os.environ["LD_PRELOAD"]
    activation._reset_for_tests()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine runs in this process
    register_mod.register()
    assert recorded_activation == {"worker": 1, "capture": 1}


def test_register_keeps_a_users_strict_setting_and_mode_off(fake_vllm, recorded_activation, monkeypatch, tmp_path):
    PLUGIN.check_strict_setting_and_mode_off(recorded_activation, monkeypatch, tmp_path)


def test_register_with_the_real_child_environment(fake_vllm, recorded_activation, monkeypatch, tmp_path):
    PLUGIN.check_real_child_environment(monkeypatch, tmp_path)


def test_register_without_libfoundry_names_the_way_out(fake_vllm, recorded_activation, monkeypatch, tmp_path):
    def missing(**_kw):
        raise FileNotFoundError("libfoundry.so")

    monkeypatch.setattr(activation, "prepare_child_environment", missing)
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    with pytest.raises(StateError, match="--foundry-mode off"):
        register_mod.register()


def test_register_rejects_a_bad_mode(fake_vllm, recorded_activation, monkeypatch):
    monkeypatch.setenv("FOUNDRY_MODE", "restore")
    with pytest.raises(InvalidArgumentError, match="FOUNDRY_MODE"):
        register_mod.register()


@pytest.mark.parametrize("var, value", [("FOUNDRY_VLLM_INSTANTIATE", "soon"),
                                        ("FOUNDRY_VLLM_PIECE_INSTANTIATE", "later")])
def test_register_refuses_a_wrong_load_setting_in_the_first_process(fake_vllm, recorded_activation, monkeypatch,
                                                                   tmp_path, var, value):
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    monkeypatch.setenv("FOUNDRY_MODE", "auto")
    monkeypatch.setenv(var, value)
    with pytest.raises(InvalidArgumentError, match=f"{var}={value!r}"):
        register_mod.register()


def test_register_survives_moved_cli_seams(monkeypatch, recorded_activation, caplog):
    install_fake_packages(monkeypatch, ["vllm.engine.arg_utils"])
    empty = types.ModuleType("vllm.engine.arg_utils")
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", empty)
    register_mod.register()
    assert "cli.add_cli_args" in caplog.text and "FOUNDRY_ARCHIVE" in caplog.text


# ---- CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def activations(monkeypatch):
    return PLUGIN.record_activations(monkeypatch)


def test_cli_flags_reach_the_environment(fake_vllm, activations, tmp_path):
    cli.install(strict=True)
    arg_utils = fake_vllm["vllm.engine.arg_utils"]
    parser = arg_utils.AsyncEngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--model", "m", "--foundry-archive", str(tmp_path / "a"), "--foundry-mode", "save"])
    engine_args = arg_utils.AsyncEngineArgs.from_cli_args(args)
    assert type(engine_args) is arg_utils.AsyncEngineArgs and engine_args.model == "m"
    assert os.environ["FOUNDRY_ARCHIVE"] == str(tmp_path / "a") and os.environ["FOUNDRY_MODE"] == "save"
    assert [s.mode for s in activations] == [Mode.SAVE] and activations[0].archive == tmp_path / "a"


def test_cli_relative_archive_becomes_absolute(fake_vllm, activations, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cli.install(strict=True)
    arg_utils = fake_vllm["vllm.engine.arg_utils"]
    args = arg_utils.EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args(["--foundry-archive", "rel"])
    arg_utils.EngineArgs.from_cli_args(args)
    assert os.environ["FOUNDRY_ARCHIVE"] == str(tmp_path / "rel") and os.environ["FOUNDRY_MODE"] == "auto"


def test_cli_without_flags_leaves_the_environment(fake_vllm, activations):
    cli.install(strict=True)
    arg_utils = fake_vllm["vllm.engine.arg_utils"]
    args = arg_utils.EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args([])
    arg_utils.EngineArgs.from_cli_args(args)
    assert "FOUNDRY_MODE" not in os.environ and not activations


def test_cli_exports_the_data_parallel_size_for_dense_replicas(fake_vllm, activations, monkeypatch):
    monkeypatch.setenv("FOUNDRY_VLLM_DP_SIZE", "4")  # a stale value: every start overwrites it
    cli.install(strict=True)
    arg_utils = fake_vllm["vllm.engine.arg_utils"]
    arg_utils.EngineArgs.from_cli_args(arg_utils.EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args([]))
    assert os.environ["FOUNDRY_VLLM_DP_SIZE"] == "1"
    cli.export_replicas(types.SimpleNamespace(data_parallel_size=2))
    assert os.environ["FOUNDRY_VLLM_DP_SIZE"] == "2" and os.environ["FOUNDRY_VLLM_DP_SIZE_LOCAL"] == "2"
    assert os.environ["FOUNDRY_VLLM_DP_BACKEND"] == "mp"
    cli.export_replicas(types.SimpleNamespace(data_parallel_size=4, data_parallel_size_local=2,
                                              data_parallel_backend="ray"))
    assert [os.environ[f"FOUNDRY_VLLM_DP_{k}"] for k in ("SIZE", "SIZE_LOCAL", "BACKEND")] == ["4", "2", "ray"]


def test_cli_mode_off_is_exported_without_activation(fake_vllm, activations, monkeypatch, tmp_path):
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    cli.install(strict=True)
    arg_utils = fake_vllm["vllm.engine.arg_utils"]
    args = arg_utils.EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args(["--foundry-mode", "off"])
    arg_utils.EngineArgs.from_cli_args(args)
    assert os.environ["FOUNDRY_MODE"] == "off" and not activations


def test_cli_load_without_archive_is_an_error(fake_vllm, activations):
    cli.install(strict=True)
    arg_utils = fake_vllm["vllm.engine.arg_utils"]
    args = arg_utils.EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args(["--foundry-mode", "load"])
    with pytest.raises(InvalidArgumentError, match="--foundry-archive"):
        arg_utils.EngineArgs.from_cli_args(args)


def test_cli_rejects_unknown_modes_and_adds_flags_once(fake_vllm, capsys):
    PLUGIN.check_cli_flags_added_once(fake_vllm["vllm.engine.arg_utils"].EngineArgs, capsys)


def test_cli_seam_with_the_wrong_shape_is_refused(monkeypatch):
    PLUGIN.check_wrong_shape_cli_seam(monkeypatch, "vllm.engine.arg_utils", "EngineArgs", "vllm_version")


# ---- adapter -----------------------------------------------------------------------------------


class CGMode(enum.Enum):
    NONE = 0
    FULL = 2
    FULL_DECODE_ONLY = (2, 0)
    FULL_AND_PIECEWISE = (2, 1)


@dataclasses.dataclass
class PassConfig:
    fuse_norm_quant: bool = False


def fake_config(**overrides: Any) -> types.SimpleNamespace:
    model = types.SimpleNamespace(model="Qwen/Qwen3-8B", revision=None, code_revision=None, dtype="bfloat16",
                                  quantization=None, max_model_len=4096, architectures=["Qwen3ForCausalLM"],
                                  hf_overrides={}, enforce_eager=False, enable_sleep_mode=False,
                                  compute_hash=lambda: overrides.get("model_hash", "hash-1"))
    comp = types.SimpleNamespace(cudagraph_mode=CGMode.FULL_DECODE_ONLY, cudagraph_capture_sizes=[1, 2, 4, 8],
                                 mode=3, backend="inductor", custom_ops=["none"], splitting_ops=[],
                                 pass_config=PassConfig(), max_cudagraph_capture_size=8)
    cfg = types.SimpleNamespace(
        model_config=model, compilation_config=comp,
        cache_config=types.SimpleNamespace(block_size=16, cache_dtype="auto", gpu_memory_utilization=0.9,
                                           kv_cache_memory_bytes=None, num_gpu_blocks_override=None,
                                           enable_prefix_caching=True),
        scheduler_config=types.SimpleNamespace(max_num_seqs=256, max_num_batched_tokens=8192),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
                                              enable_expert_parallel=False, enable_dbo=False),
        load_config=types.SimpleNamespace(load_format="dummy"), attention_config=types.SimpleNamespace(backend=None),
        kernel_config=None, additional_config={}, speculative_config=None, lora_config=None, use_v2_model_runner=True)
    for key, value in overrides.items():
        if key == "model_hash":
            continue
        target, _, attr = key.rpartition(".")
        setattr(getattr(cfg, target) if target else cfg, attr, value)
    return cfg


def fingerprint(cfg, environ=None, tmp=None) -> dict:
    adapter = adapter_mod.VllmAdapter(cfg, engine_version="0.25.0", environ=environ or {})
    return session_fingerprint(adapter, tmp or "/nonexistent/archive")


def test_adapter_fingerprint_fields():
    fp = fingerprint(fake_config())
    assert fp["engine.name"] == "vllm" and fp["engine.version"] == "0.25.0"
    assert fp["engine.capture_sizes"] == [8, 4, 2, 1]  # vLLM captures the largest first
    assert fp["engine.dtype"] == "bfloat16" and fp["engine.tp"] == 1 and fp["engine.world_size"] == 1
    assert fp["engine.knob.cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert fp["engine.knob.model_runner"] == "v2"
    assert fp["engine.knob.gpu_memory_utilization"] == 0.9
    assert '"fuse_norm_quant":false' in fp["engine.knob.pass_config"]


def test_adapter_model_hash_follows_graph_shaping_fields():
    base = fingerprint(fake_config())["engine.model_hash"]
    assert fingerprint(fake_config())["engine.model_hash"] == base
    assert fingerprint(fake_config(**{"model_config.max_model_len": 8192}))["engine.model_hash"] != base
    assert fingerprint(fake_config(model_hash="hash-2"))["engine.model_hash"] != base
    assert fingerprint(fake_config(**{"load_config.load_format": "safetensors"}))["engine.model_hash"] != base
    # Settings that are not in the model identity have their own field, so a mismatch names them.
    other = fingerprint(fake_config(**{"cache_config.gpu_memory_utilization": 0.8}))
    assert other["engine.model_hash"] == base and other["engine.knob.gpu_memory_utilization"] == 0.8


def test_adapter_knobs_include_graph_environment_and_expert_parallel():
    fp = fingerprint(fake_config(**{"parallel_config.enable_expert_parallel": True}),
                     environ={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "HOME": "/root"})
    assert fp["engine.knob.env"] == '{"VLLM_ATTENTION_BACKEND":"FLASH_ATTN"}'
    assert fp["engine.ep"] == 1  # tp * dp


def test_adapter_plain_values_are_stable():
    class Opaque:
        pass

    assert adapter_mod.plain(CGMode.FULL_DECODE_ONLY) == "FULL_DECODE_ONLY"
    assert adapter_mod.plain({"a": {2, 1}, "b": (1, None)}) == {"a": [1, 2], "b": [1, None]}
    assert adapter_mod.plain(PassConfig()) == {"fuse_norm_quant": False}
    assert adapter_mod.plain(Opaque()) == "Opaque"  # no address in the fingerprint
    assert adapter_mod.plain(float("nan")) == "nan"


def test_adapter_int_enum_knobs_survive_the_archive_round_trip():
    # vLLM's CompilationMode is an IntEnum: it must be written and compared by name, or a LOAD
    # compares the saved 3 with the live enum and calls its own archive stale.
    import json

    from foundry_core.engine.fingerprint import describe_mismatch

    class CompilationMode(enum.IntEnum):
        VLLM_COMPILE = 3

    assert adapter_mod.plain(CompilationMode.VLLM_COMPILE) == "VLLM_COMPILE"
    fp = fingerprint(fake_config(**{"compilation_config.mode": CompilationMode.VLLM_COMPILE}))
    assert fp["engine.knob.compilation_mode"] == "VLLM_COMPILE"
    assert describe_mismatch(json.loads(json.dumps(fp)), fp) is None


def test_adapter_record_state_needs_the_kv_cache():
    adapter = adapter_mod.VllmAdapter(fake_config(), engine_version="0.25.0")
    assert adapter.foundry_record_state() is None
    adapter.state.update(kv_cache_bytes=1 << 30, kv_cache_blocks=4096, graphs=["g"])
    assert adapter.foundry_record_state() == {"kv_cache_bytes": 1 << 30, "kv_cache_blocks": 4096, "graphs": ["g"]}


# ---- modes -------------------------------------------------------------------------------------


def test_modes_refuse_other_cudagraph_modes_by_name():
    modes.check_supported(fake_config(**{"compilation_config.cudagraph_mode": CGMode.FULL_AND_PIECEWISE}))
    with pytest.raises(modes.UnsupportedConfigError) as err:
        modes.check_supported(fake_config(**{"compilation_config.cudagraph_mode": CGMode.FULL}))
    text = str(err.value)
    assert "cudagraph_mode=FULL " in text and "supported: FULL_AND_PIECEWISE, FULL_DECODE_ONLY" in text
    assert "-cc.cudagraph_mode=FULL_DECODE_ONLY" in text and "--foundry-mode off" in text
    with pytest.raises(modes.UnsupportedConfigError, match="without torch.compile"):
        modes.check_supported(fake_config(**{"compilation_config.cudagraph_mode": CGMode.NONE}))


def test_a_vllm_without_the_piece_seam_refuses_the_piecewise_modes_only(fake_vllm, monkeypatch):
    monkeypatch.delenv(piecewise.ENV, raising=False)
    capture_patches.install()  # the fake vLLM has no vllm.compilation.cuda_graph
    assert not piecewise.enabled()
    problem = modes.cudagraph_mode_problem(CGMode.FULL_AND_PIECEWISE)
    assert "lacks a seam" in problem and "vLLM seam 'piece." in problem and "supported: FULL_DECODE_ONLY)" in problem
    assert modes.cudagraph_mode_problem(CGMode.FULL_DECODE_ONLY) is None


def test_modes_list_every_problem_at_once():
    cfg = fake_config(**{"parallel_config.pipeline_parallel_size": 2, "use_v2_model_runner": False,
                         "lora_config": object()})
    problems = modes.unsupported_settings(cfg)
    assert any("pipeline_parallel_size=2" in p for p in problems)
    assert any("V1 model runner" in p for p in problems) and any("LoRA" in p for p in problems)
    assert modes.unsupported_settings(fake_config()) == []


def test_data_parallel_of_dense_models_on_one_node_through_vllms_launcher_only(monkeypatch):
    dense_replica = fake_config(**{"parallel_config.data_parallel_index": 1})  # what vLLM gives a dense replica
    monkeypatch.setenv("FOUNDRY_VLLM_DP_SIZE", "2")
    assert modes.unsupported_settings(dense_replica) == []
    # A MoE replica keeps data_parallel_size > 1 inside its engine: its default backend is supported.
    assert modes.unsupported_settings(fake_config(**{"parallel_config.data_parallel_size": 2})) == []
    monkeypatch.setenv("FOUNDRY_VLLM_DP_BACKEND", "ray")
    ray = modes.unsupported_settings(dense_replica)
    assert len(ray) == 1 and "data parallel through 'ray'" in ray[0]
    monkeypatch.setenv("FOUNDRY_VLLM_DP_BACKEND", "mp")
    monkeypatch.setenv("FOUNDRY_VLLM_DP_SIZE_LOCAL", "1")
    nodes = modes.unsupported_settings(dense_replica)
    assert len(nodes) == 1 and "across nodes (1 of 2 replicas" in nodes[0]
    problems = modes.unsupported_settings(fake_config(**{"parallel_config.enable_expert_parallel": True,
                                                         "parallel_config.nnodes": 2}))
    assert any("nnodes=2" in p for p in problems) and not any("expert" in p for p in problems)


def test_mixture_of_experts_replicas_only_through_nccl():
    moe_dp = {"parallel_config.data_parallel_size": 2, "parallel_config.enable_expert_parallel": True}
    assert modes.unsupported_settings(fake_config(**moe_dp)) == []  # the default all-gather/reduce-scatter backend
    assert modes.unsupported_settings(fake_config(**{"parallel_config.data_parallel_size": 2})) == []  # experts sliced
    (deepep,) = modes.unsupported_settings(fake_config(**moe_dp, **{"parallel_config.all2all_backend": "deepep_low_latency"}))
    assert "all2all_backend='deepep_low_latency'" in deepep and "allgather_reducescatter" in deepep
    (elastic,) = modes.unsupported_settings(fake_config(**moe_dp, **{"parallel_config.enable_elastic_ep": True}))
    assert "enable_elastic_ep" in elastic


def test_expert_parallel_over_the_tensor_parallel_group_is_accepted_but_never_with_load_balancing():
    ep = {"parallel_config.enable_expert_parallel": True, "parallel_config.tensor_parallel_size": 2}
    assert modes.unsupported_settings(fake_config(**ep)) == []
    (eplb,) = modes.unsupported_settings(fake_config(**ep, **{"parallel_config.enable_eplb": True}))
    assert "enable_eplb" in eplb
    # With data parallel the experts are exchanged by an all-to-all backend: NCCL's is supported, DeepEP is not.
    assert modes.unsupported_settings(fake_config(**ep, **{"parallel_config.data_parallel_size": 2})) == []
    (deepep,) = modes.unsupported_settings(fake_config(**ep, **{"parallel_config.data_parallel_size": 2,
                                                                "parallel_config.all2all_backend": "deepep_high_throughput"}))
    assert "deepep_high_throughput" in deepep


@pytest.mark.parametrize(("tp", "dp", "dp_rank", "backend", "rank", "expected"), [
    (1, 1, 0, None, 0, 0),                    # one GPU
    (2, 1, 0, None, 1, 1),                    # tensor parallel: the engine's rank is global
    (1, 2, 1, None, 0, 1),                    # MoE data parallel: replica 1's only worker
    (2, 2, 1, None, 1, 3),                    # replica 1, its second tensor-parallel rank
    (2, 2, 1, "external_launcher", 3, 3),     # torchrun-style launch: vLLM does not offset
])
def test_global_rank_offsets_by_the_data_parallel_rank_as_vllm_does(tp, dp, dp_rank, backend, rank, expected):
    cfg = fake_config(**{"parallel_config.tensor_parallel_size": tp, "parallel_config.data_parallel_size": dp,
                         "parallel_config.data_parallel_rank": dp_rank,
                         "parallel_config.distributed_executor_backend": backend})
    assert ranks.global_rank(cfg, rank) == expected
    assert ranks.world_size(cfg) == tp * dp
    assert adapter_mod.VllmAdapter(cfg, environ={}).foundry_parallel_config()["dp"] == dp


@pytest.mark.parametrize(("tp", "index", "rank", "expected"), [(1, 0, 0, 0), (1, 1, 0, 1), (2, 1, 1, 3)])
def test_dense_replicas_take_their_index_from_data_parallel_index(tp, index, rank, expected):
    # vLLM 0.25's run_engine_core: a dense model's replica runs with data_parallel_size=1 and
    # data_parallel_rank=0; only data_parallel_index (and the CLI's export) tell the replicas apart.
    cfg = fake_config(**{"parallel_config.tensor_parallel_size": tp, "parallel_config.data_parallel_index": index})
    env = {"FOUNDRY_VLLM_DP_SIZE": "2"}
    assert ranks.global_rank(cfg, rank, env) == expected and ranks.replicas(cfg, env) == (index, 2)
    assert ranks.world_size(cfg) == tp  # vLLM's world is the replica's own
    parallel = adapter_mod.VllmAdapter(cfg, environ=env).foundry_parallel_config()
    assert parallel["dp"] == 2 and parallel["tp"] == tp


def test_a_dense_replica_without_the_exported_count_is_refused():
    cfg = fake_config(**{"parallel_config.data_parallel_index": 1})
    with pytest.raises(StateError, match="replica 1"):
        ranks.global_rank(cfg, 0, {})
    with pytest.raises(InvalidArgumentError, match="FOUNDRY_VLLM_DP_SIZE"):
        ranks.replicas(cfg, {"FOUNDRY_VLLM_DP_SIZE": "two"})
    assert ranks.replicas(fake_config(), {}) == (0, 1)


def test_tensor_parallel_is_supported_and_all_reduces_through_nccl(monkeypatch):
    cfg = fake_config(**{"parallel_config.tensor_parallel_size": 2})
    cfg.parallel_config.disable_custom_all_reduce = False
    assert modes.unsupported_settings(cfg) == []
    monkeypatch.delenv("VLLM_ALLREDUCE_USE_SYMM_MEM", raising=False)
    worker_patches.use_nccl_all_reduce(cfg)
    assert cfg.parallel_config.disable_custom_all_reduce is True
    assert os.environ["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    single = fake_config()
    single.parallel_config.disable_custom_all_reduce = False
    monkeypatch.delenv("VLLM_ALLREDUCE_USE_SYMM_MEM")
    worker_patches.use_nccl_all_reduce(single)
    assert single.parallel_config.disable_custom_all_reduce is False and "VLLM_ALLREDUCE_USE_SYMM_MEM" not in os.environ


def test_modes_enforce_eager_and_resolved_mode():
    eager = fake_config(**{"model_config.enforce_eager": True})
    assert any("enforce_eager" in p for p in modes.unsupported_settings(eager))
    modes.check_resolved_mode(CGMode.FULL_DECODE_ONLY)
    modes.check_resolved_mode(CGMode.FULL_AND_PIECEWISE)
    with pytest.raises(modes.UnsupportedConfigError, match="resolve the CUDA-graph mode to FULL:"):
        modes.check_resolved_mode(CGMode.FULL)
    assert modes.mode_name("CUDAGraphMode.PIECEWISE") == "PIECEWISE" and modes.mode_name(None) == "NONE"


# ---- seams and patching ------------------------------------------------------------------------


def test_seam_list_is_the_single_source():
    PLUGIN.check_seam_list("vllm", "vllm/v1/worker/gpu_worker.py")


def test_patching_is_idempotent_and_reversible(fake_vllm):
    PLUGIN.check_patching_is_idempotent_and_reversible(fake_vllm["vllm.engine.arg_utils"].EngineArgs)


def test_patching_names_a_missing_seam(fake_vllm):
    del fake_vllm["vllm.v1.worker.gpu_worker"].kernel_warmup
    with pytest.raises(patching.SeamError) as err:
        patching.install("worker.kernel_warmup", worker_patches.wrap_kernel_warmup)
    text = str(err.value)
    assert "'worker.kernel_warmup'" in text and "vllm.v1.worker.gpu_worker.kernel_warmup" in text
    assert "0.0.fake" in text and "0.25.0" in text


def test_patching_refuses_changed_parameters(fake_vllm):
    mod = fake_vllm["vllm.v1.worker.gpu_worker"]
    mod.init_worker_distributed_environment = lambda config, world_rank: None
    with pytest.raises(patching.SeamError, match=r"expected parameters starting with \(vllm_config, rank\)"):
        patching.install("worker.init_distributed", worker_patches.wrap_init_distributed)


# ---- runtime pauses ----------------------------------------------------------------------------


class FakeSession:
    def __init__(self, mode, state=None, archive=None, log=None):
        self.mode = self.requested = mode
        self.state = state
        self.archive = archive
        self.rank_dir = None  # no archive directory: nothing carried
        self.log = log if log is not None else []
        self.saved = None

    def begin(self):
        self.log.append("begin")

    def determinism_boundary(self):
        self.log.append("boundary")

    def load_images_ahead(self, bind, warm_execs=False):
        self.log.append("images_ahead")

    def recorded_state(self):
        return self.state if self.mode is Mode.LOAD else None

    def load(self, instantiate="eager", threads=4, defer=None):
        self.log.append(("load", instantiate))
        self.defer = defer
        return self.archive

    def save(self, graphs):
        self.log.append("save")
        self.saved = graphs
        return "report"

    def end(self):
        self.log.append("end")

    def fall_back(self, cause):
        self.log.append(("fallback", str(cause)))
        self.mode = Mode.SAVE
        return Mode.SAVE


def test_pause_order_nesting_and_closed_region():
    dev = FakeDevice()
    rt = runtime.WorkerRuntime(FakeSession(Mode.SAVE), adapter_mod.VllmAdapter(fake_config()), dev)
    check_pause_nesting(rt, dev)
    check_no_pause_after_finish(rt, dev)


def test_pause_resumes_the_region_when_the_work_fails():
    dev = FakeDevice()
    rt = runtime.WorkerRuntime(FakeSession(Mode.SAVE), adapter_mod.VllmAdapter(fake_config()), dev)
    check_pause_resumes_after_failure(rt, dev)


def test_lazy_instantiation_follows_the_setting(monkeypatch):
    rt = runtime.WorkerRuntime(FakeSession(Mode.LOAD), adapter_mod.VllmAdapter(fake_config()), FakeDevice())
    for value, lazy in (("", False), ("lazy", True), ("background", False), ("sometimes", False)):
        monkeypatch.setenv("FOUNDRY_VLLM_INSTANTIATE", value)
        assert rt.lazy_instantiation() is lazy


def test_instantiate_mode_setting(monkeypatch):
    assert modes.instantiate_mode() == ("eager", 4)
    monkeypatch.setenv("FOUNDRY_VLLM_INSTANTIATE", "background")
    assert modes.instantiate_mode()[0] == "background"
    monkeypatch.setenv("FOUNDRY_VLLM_INSTANTIATE", "later")
    with pytest.raises(InvalidArgumentError, match="FOUNDRY_VLLM_INSTANTIATE"):
        modes.instantiate_mode()


# ---- capture helpers ---------------------------------------------------------------------------


class Tensor:
    def __init__(self, ptr, is_cuda=True):
        self.ptr, self.is_cuda = ptr, is_cuda

    def data_ptr(self):
        return self.ptr


def test_graph_names_and_addresses():
    @dataclasses.dataclass(frozen=True)
    class Desc:
        cg_mode: CGMode
        num_tokens: int
        num_reqs: int | None = None

    assert capture_patches.graph_name(Desc(CGMode.FULL_DECODE_ONLY, 8, 8)) == \
        "cg_mode=FULL_DECODE_ONLY,num_tokens=8,num_reqs=8"
    shared = types.SimpleNamespace(seq_lens=Tensor(0x10), cpu=Tensor(0x99, is_cuda=False), n=3)
    state = ({"l1": shared, "l0": shared}, {"l0": Tensor(0x20)})
    assert capture_patches.tensor_addresses(state) == {"[0][l0].seq_lens": 0x10, "[1][l0]": 0x20}
    saved = {"g": {"a": 1, "b": 2}}
    assert capture_patches.address_mismatch(saved, {"g": {"a": 1, "b": 2, "c": 5}}) is None
    assert "metadata b at 0x3, at SAVE 0x2" in capture_patches.address_mismatch(saved, {"g": {"a": 1, "b": 3}})


def test_observing_factory_quiets_both_factory_shapes():
    sink: dict = {}
    calls = []
    tuple_factory = capture_patches.observing(lambda d, w: (lambda m: calls.append(m), {"t": Tensor(7)}), sink,
                                              quiet=True)
    fn, state = tuple_factory("desc", False)
    fn("NONE")
    assert calls == [] and sink == {"desc": {"[t]": 7}}
    plain_factory = capture_patches.observing(lambda d, w: (lambda m: calls.append(m)), sink, quiet=False)
    plain_factory("d2", False)("NONE")
    assert calls == ["NONE"] and "d2" not in sink


def test_swapped_restores_attributes_on_error():
    owner = types.SimpleNamespace(a=1)
    with pytest.raises(RuntimeError), capture_patches.swapped(owner, a=2):
        assert owner.a == 2
        raise RuntimeError
    assert owner.a == 1


# ---- SAVE and LOAD flows over the fake vLLM ------------------------------------------------------


class FakeRestored:
    def __init__(self, name, index, log):
        self.name, self.index, self.log = name, index, log

    def replay(self, stream=None):
        self.log.append(("replay", self.name))


class FakeArchive:
    def __init__(self, names, log, hidden):
        self.graphs = [FakeRestored(n, i, log) for i, n in enumerate(names)]
        self.hidden = hidden
        self.closed = False
        self.background = False
        self.times = LoadTimes()

    def __iter__(self):
        return iter(self.graphs)

    def outputs(self, i):
        return (self.hidden,)

    def start_background(self):
        self.background = True

    def close(self):
        self.closed = True


@pytest.fixture
def worker_env(fake_vllm, monkeypatch, tmp_path):
    """Installs the worker and capture seams over the fake vLLM; returns a start(mode, ...) helper
    that runs one worker start-up and returns (log, session, worker, device log)."""
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    monkeypatch.setattr(worker_patches, "preload_active", lambda: True)
    worker_patches.install()
    capture_patches.install()
    cg = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"]
    worker_mod = fake_vllm["vllm.v1.worker.gpu_worker"]

    def start(mode, state=None, archive_names=None, metadata_ptr=0x5000, blocks=64, config=None, requested=None,
              free=1 << 40):
        cg.LOG.clear()
        log = cg.LOG
        monkeypatch.setenv("FOUNDRY_MODE", mode)
        archive = FakeArchive(archive_names, log, cg.FakeTensor(0x7000)) if archive_names is not None else None
        session = FakeSession(Mode(mode), state=state, archive=archive, log=log)
        session.requested = Mode(requested or mode)  # auto resolves to save or load on each rank
        monkeypatch.setattr(runtime, "EngineSession", lambda *a, **k: session)
        dev_log: list = []
        monkeypatch.setattr(runtime, "DeviceOps", lambda: FakeDevice(dev_log, free=free))
        runtime.reset()
        cfg = config or fake_config(**{"compilation_config.cudagraph_mode": cg.CUDAGraphMode.FULL_DECODE_ONLY})
        worker = worker_mod.Worker(cfg)
        worker.init_device()
        worker.model_runner.metadata_ptr = metadata_ptr
        kv = worker.determine_available_memory()
        worker.initialize_from_config(types.SimpleNamespace(num_blocks=blocks))
        worker.compile_or_warm_up_model()
        return log, session, worker, kv, dev_log

    return start


def _saved_state(rt_state: dict) -> Any:
    return types.SimpleNamespace(kv_cache_bytes=rt_state["kv_cache_bytes"], kv_cache_blocks=rt_state["kv_cache_blocks"],
                                 adapter={k: v for k, v in rt_state.items()
                                          if k not in ("kv_cache_bytes", "kv_cache_blocks")})


def test_save_flow(worker_env):
    log, session, worker, kv, dev = worker_env("save")
    steps = [e for e in log if isinstance(e, str)]
    assert steps[:4] == ["set_device", "begin", "nccl", "boundary"]
    assert kv == 1000 and "profile_run" in steps and "kernel_warmup" in steps
    # NCCL's bring-up and the SAVE-only work ran paused: four pauses (NCCL, profiling, compile
    # warmup, kernel warmup).
    assert dev.count("stop_region") == 4 and dev.count("resume_region") == 4
    assert steps.index("save") < steps.index("end") < steps.index("warmup_kernels")
    forwards = [e for e in log if isinstance(e, tuple) and e[0] == "forward"]
    assert len(forwards) == 6  # a warmup and a capture forward per graph
    manager = worker.model_runner.cudagraph_manager
    assert all(isinstance(g, KeepGraph) and g.keep_graph for g in manager.graphs.values())
    assert list(session.saved) == [capture_patches.graph_name(d) for d in manager.graphs]
    assert all(out[0] is manager.hidden_states for _, out in session.saved.values())
    state = runtime.current().adapter.state
    assert state["kv_cache_bytes"] == 1000 and state["kv_cache_blocks"] == 64
    assert state["outputs"] == {"hidden_states": 1, "aux_hidden_states": 0}
    assert set(state["attention_addresses"]) == set(session.saved)


def test_load_flow_restores_instead_of_capturing(worker_env, monkeypatch):
    _, _, _, _, _ = worker_env("save")
    saved_names = list(runtime.current().session.saved)
    state = _saved_state(runtime.current().adapter.state)
    log, session, worker, kv, dev = worker_env("load", state=state, archive_names=saved_names)
    steps = [e for e in log if isinstance(e, str)]
    assert kv == 1000 and worker.available_kv_cache_memory_bytes == 1000
    assert "profile_run" not in steps and "kernel_warmup" not in steps
    assert not any(isinstance(e, tuple) and e[0] in ("forward", "dummy_run") for e in log)
    assert ("load", "eager") in log and "save" not in steps
    assert steps.index("end") < steps.index("warmup_kernels")
    manager = worker.model_runner.cudagraph_manager
    assert [g.name for g in manager.graphs.values()] == saved_names and manager._graphs_captured
    assert manager.hidden_states.data_ptr() == 0x7000 and manager._foundry_archive is session.archive
    desc = next(iter(manager.graphs))
    manager.run_fullgraph(desc)
    assert log[-1] == ("replay", capture_patches.graph_name(desc))
    # LOAD mirrors SAVE's cache flushes and pauses, with no work inside them.
    assert dev.count("empty_cache") == 8 and dev.count("stop_region") == 4


def test_save_and_load_place_vllms_workspace_in_the_region_at_the_same_point(worker_env, fake_vllm, monkeypatch):
    cg, ws = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"], fake_vllm["vllm.v1.worker.workspace"]

    def allocate(size, device):
        rt = runtime.current()
        cg.LOG.append(("workspace", size, rt.region_open and rt._pause_depth == 0))  # in the region, not paused
        return ws.Buffer(size, 0x1000_0000)

    monkeypatch.setattr(workspace, "torch_bytes", allocate)
    monkeypatch.setattr(workspace, "in_region", lambda address: 0x1000_0000 <= address < 0x2000_0000)
    monkeypatch.setattr(ws, "PROFILE_GROWS", 4096)

    def allocation_points(log):
        return [e for e in log if e == "capture_model" or (isinstance(e, tuple) and e[0] in ("workspace", "kv_cache"))]

    log, *_ = worker_env("save")
    saved = allocation_points(log)
    assert log.index("profile_run") < log.index(saved[0])
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    assert state.adapter["workspace"] == [4096]
    log, *_ = worker_env("load", state=state, archive_names=names)
    assert "profile_run" not in log
    assert allocation_points(log) == saved == [("workspace", 4096, True), ("kv_cache", 64), "capture_model"]
    assert ws.current_workspace_manager()._current_workspaces[0].data_ptr() == 0x1000_0000


def test_load_needs_free_memory_for_the_kv_cache_and_the_workspace(worker_env, fake_vllm, monkeypatch):
    ws = fake_vllm["vllm.v1.worker.workspace"]
    monkeypatch.setattr(workspace, "torch_bytes", lambda size, device: ws.Buffer(size, 0x1000_0000))
    monkeypatch.setattr(workspace, "in_region", lambda address: 0x1000_0000 <= address < 0x2000_0000)
    monkeypatch.setattr(ws, "PROFILE_GROWS", 4096)
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    log, *_ = worker_env("load", state=state, archive_names=names, free=1000 + 4095)  # the KV cache fits, not both
    assert any(isinstance(e, tuple) and e[0] == "fallback" and "workspace need 5096" in e[1] for e in log), log
    log, *_ = worker_env("load", state=state, archive_names=names, free=1000 + 4096)
    assert ("load", "eager") in log


def test_save_warns_when_the_workspace_grew_again_before_capture(worker_env, fake_vllm, monkeypatch, caplog):
    ws = fake_vllm["vllm.v1.worker.workspace"]
    monkeypatch.setattr(workspace, "torch_bytes", lambda size, device: ws.Buffer(size, 0x1000_0000))
    monkeypatch.setattr(workspace, "in_region", lambda address: 0x1000_0000 <= address < 0x2000_0000)
    monkeypatch.setattr(ws, "PROFILE_GROWS", 4096)
    runner = fake_vllm["vllm.v1.worker.gpu.model_runner"].GPUModelRunner
    dummy_run = runner._dummy_run

    def growing_dummy_run(self, num_tokens, *args, **kwargs):  # a paused warmup forward that needs more
        ws.current_workspace_manager()._current_workspaces[0] = ws.Buffer(8192, 0x7F00_0000)
        return dummy_run(self, num_tokens, *args, **kwargs)

    monkeypatch.setattr(runner, "_dummy_run", growing_dummy_run)
    with caplog.at_level(logging.WARNING, logger="foundry.vllm"):
        worker_env("save")
    assert "workspace grew after the memory profile, outside the region (slots [0])" in caplog.text


def test_an_archive_without_workspace_sizes_places_nothing(worker_env, fake_vllm, monkeypatch):
    monkeypatch.setattr(workspace, "torch_bytes", lambda size, device: pytest.fail("allocated a workspace"))
    monkeypatch.setattr(workspace, "in_region", lambda address: True)  # SAVE: the profile's buffer is placed already
    monkeypatch.setattr(fake_vllm["vllm.v1.worker.workspace"], "PROFILE_GROWS", 4096)
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    assert state.adapter["workspace"] == [0]
    del state.adapter["workspace"]  # an archive written before the workspace was placed
    worker_env("load", state=state, archive_names=names)
    assert fake_vllm["vllm.v1.worker.workspace"].current_workspace_manager()._current_workspaces == [None]


@pytest.mark.parametrize("pieces, instantiate, deferred, background", [
    (None, None, True, True),                   # default: the pieces on a thread after the restore
    ("restore", None, False, False),            # every graph in the restore
    ("first-use", None, True, False),
    ("background", None, True, True),
    ("first-use", "lazy", False, False),        # lazy and background instantiate every graph later anyway
    ("background", "background", False, False),
])
def test_load_leaves_the_pieces_for_later_when_asked(worker_env, monkeypatch, pieces, instantiate, deferred,
                                                    background):
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    for var, value in ((piecewise.INSTANTIATE_ENV, pieces), (modes.INSTANTIATE_ENV, instantiate)):
        if value is not None:
            monkeypatch.setenv(var, value)
    _, session, *_ = worker_env("load", state=state, archive_names=names)
    assert (session.defer is piecewise.is_piece) == deferred and (deferred or session.defer is None)
    assert session.archive.background == background
    if deferred:
        assert session.defer("pw:backbone:0/3:num_tokens=8") and not session.defer(names[0])


def test_load_skips_capture_models_garbage_collection(worker_env, fake_vllm, monkeypatch):
    import gc

    collections: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *a, **k: collections.append(runtime.current().mode.value) or 0)
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    assert collections == ["save"]
    worker_env("load", state=state, archive_names=names)
    assert collections == ["save"]  # LOAD's capture_model ran without it
    assert fake_vllm["vllm.v1.worker.gpu.model_runner"].gc is gc  # and gave the module its gc back


def test_load_numbers_the_dummy_requests_of_its_capture_loop(worker_env, fake_vllm):
    def request_ids(log):
        return [i for e in log if isinstance(e, tuple) and e[0] == "requests" for i in e[1]]

    random_uuid = fake_vllm["vllm.v1.worker.gpu.input_batch"].random_uuid
    log, *_ = worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    saved = request_ids(log)
    assert len(saved) == 12 and len(set(saved)) == 12  # vLLM's own random names at SAVE
    log, *_ = worker_env("load", state=state, archive_names=names)
    assert request_ids(log) == [f"req_{i % 2}_{n:016x}" for n, i in enumerate(range(12))]  # numbered, distinct
    assert fake_vllm["vllm.v1.worker.gpu.input_batch"].random_uuid is random_uuid  # put back after the loop


def test_load_runs_the_warmups_outside_the_region_when_asked(worker_env, monkeypatch):
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    monkeypatch.setenv(runtime.LOAD_WARMUPS_ENV, "1")
    log, session, _, _, dev = worker_env("load", state=state, archive_names=names)
    steps = [e for e in log if isinstance(e, str)]
    assert "kernel_warmup" in steps and any(isinstance(e, tuple) and e[0] == "dummy_run" for e in log)
    assert ("load", "eager") in log and "save" not in steps and session.mode is Mode.LOAD  # still restored
    assert dev.count("stop_region") == 4  # the same pauses as without: the warmups run inside them


def test_load_flow_can_skip_the_jit_warmup(worker_env, monkeypatch):
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    monkeypatch.setenv("FOUNDRY_VLLM_JIT_WARMUP", "0")
    log, *_ = worker_env("load", state=state, archive_names=names)
    assert "warmup_kernels" not in log


def test_load_falls_back_when_a_graph_is_missing(worker_env):
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    log, session, worker, _, _ = worker_env("load", state=state, archive_names=names[:-1])
    assert any(isinstance(e, tuple) and e[0] == "fallback" and "missing" in e[1] for e in log)
    assert session.archive.closed and session.mode is Mode.SAVE and "save" in log  # captured and saved afresh
    assert all(isinstance(g, KeepGraph) for g in worker.model_runner.cudagraph_manager.graphs.values())


def test_load_falls_back_when_attention_metadata_moved(worker_env):
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    log, session, worker, _, _ = worker_env("load", state=state, archive_names=names, metadata_ptr=0x5100)
    fallback = [e for e in log if isinstance(e, tuple) and e[0] == "fallback"]
    assert fallback and "seq_lens at 0x5100, at SAVE 0x5000" in fallback[0][1]
    assert session.mode is Mode.SAVE and "save" in log


def test_load_falls_back_when_the_kv_cache_differs(worker_env):
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    log, session, *_ = worker_env("load", state=state, archive_names=names, blocks=65)
    assert any(isinstance(e, tuple) and e[0] == "fallback" and "65 blocks" in e[1] for e in log)


@pytest.fixture
def tp_peer(monkeypatch, fake_torch):
    """torch.distributed and vLLM's tensor-parallel group for a rank whose one peer answers the
    agreements in turn from ``peer["answers"]`` (True once they run out); ``peer["calls"]``
    records each agreement as (this rank's answer, group)."""
    peer = {"answers": [], "calls": []}

    class Flag:
        def __init__(self, values):
            self.value = values[0]

        def item(self):
            return self.value

    def all_reduce(flag, op, group):
        assert op == "min"
        peer["calls"].append((flag.value, group))
        answer = peer["answers"].pop(0) if peer["answers"] else True
        flag.value = min(flag.value, int(answer))

    fake_torch.tensor = lambda values, dtype=None: Flag(values)
    fake_torch.int32 = "int32"
    dist = types.ModuleType("torch.distributed")
    dist.ReduceOp = types.SimpleNamespace(MIN="min")
    dist.all_reduce = all_reduce
    fake_torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    state_mod = types.ModuleType("vllm.distributed.parallel_state")
    state_mod.get_world_group = lambda: types.SimpleNamespace(cpu_group="world", world_size=2)
    monkeypatch.setitem(sys.modules, "vllm.distributed", types.ModuleType("vllm.distributed"))
    monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", state_mod)
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "1")
    return peer


def _fallbacks(log) -> list[str]:
    return [e[1] for e in log if isinstance(e, tuple) and e[0] == "fallback"]


def test_tensor_parallel_ranks_load_together_or_fall_back_together(worker_env, fake_vllm, tp_peer):
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    cg = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"]
    tp2 = fake_config(**{"compilation_config.cudagraph_mode": cg.CUDAGraphMode.FULL_DECODE_ONLY,
                         "parallel_config.tensor_parallel_size": 2})

    def load(answers, archive_names=names, blocks=64):
        tp_peer["answers"], tp_peer["calls"] = list(answers), []
        return worker_env("load", state=state, archive_names=archive_names, config=tp2, blocks=blocks)

    # The three agreements (the KV cache's memory, before the warmup, the restore) pass: restored.
    log, session, *_ = load([])
    assert tp_peer["calls"] == [(1, "world")] * 3 and session.mode is Mode.LOAD and not _fallbacks(log)
    # The peer cannot restore: this rank captures too.
    log, session, *_ = load([True, True, False])
    assert tp_peer["calls"] == [(1, "world")] * 3 and session.mode is Mode.SAVE and "save" in log
    assert "another rank could not restore" in _fallbacks(log)[0]
    # The peer lacks the memory (or fell back earlier): both profile (SAVE) from the start, and
    # this rank answers no to the later agreement; no restore agreement follows.
    log, session, *_ = load([False])
    assert tp_peer["calls"] == [(1, "world"), (0, "world")] and "profile_run" in log
    assert "another rank does not LOAD" in _fallbacks(log)[0]
    # The peer fell back after the first agreement (its KV-cache blocks): both warm up and capture.
    log, session, *_ = load([True, False])
    assert tp_peer["calls"] == [(1, "world")] * 2 and "kernel_warmup" in log and "save" in log
    assert "fell back before the warmup" in _fallbacks(log)[0]
    # This rank falls back there: it still answers, saying so.
    log, session, *_ = load([], blocks=65)
    assert tp_peer["calls"] == [(1, "world"), (0, "world")] and "65 blocks" in _fallbacks(log)[0]
    # A rank that cannot restore still answers, once, saying so.
    load([], archive_names=names[:-1])
    assert tp_peer["calls"] == [(1, "world"), (1, "world"), (0, "world")]


def test_a_rank_that_fell_back_before_the_memory_agreement_still_answers(worker_env, fake_vllm, tp_peer):
    cg = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"]
    tp2 = fake_config(**{"compilation_config.cudagraph_mode": cg.CUDAGraphMode.FULL_DECODE_ONLY,
                         "parallel_config.tensor_parallel_size": 2})
    # A SAVE start: no rank can LOAD, nothing to agree on.
    log, *_ = worker_env("save", config=tp2)
    assert tp_peer["calls"] == [] and "save" in log
    # Auto mode, this rank's archive unusable (SAVE) while a peer may LOAD: it answers no at each
    # agreement, so the peer profiles and captures with it instead of waiting for it forever.
    log, *_ = worker_env("save", config=tp2, requested="auto")
    assert tp_peer["calls"] == [(0, "world"), (0, "world")] and "profile_run" in log and "save" in log


def test_mixture_of_experts_replicas_through_deepep_are_refused_before_the_device(worker_env, fake_vllm):
    cg = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"]
    replica1 = fake_config(**{"compilation_config.cudagraph_mode": cg.CUDAGraphMode.FULL_DECODE_ONLY,
                              "parallel_config.data_parallel_size": 2, "parallel_config.data_parallel_rank": 1,
                              "parallel_config.all2all_backend": "deepep_low_latency"})
    with pytest.raises(modes.UnsupportedConfigError, match="all2all_backend='deepep_low_latency'"):
        worker_env("save", config=replica1)
    assert "set_device" not in cg.LOG


def _load_as_replica(worker_env, fake_vllm, monkeypatch, **parallel) -> tuple[list, Any, Any]:
    """A SAVE on one GPU, then a LOAD of its archive by a worker whose parallel config holds
    ``parallel``; (the ranks runtime.start got, the LOAD's log, its session)."""
    worker_env("save")
    names, state = list(runtime.current().session.saved), _saved_state(runtime.current().adapter.state)
    cg = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"]
    started = []
    start = runtime.start
    monkeypatch.setattr(runtime, "start", lambda cfg, rank, **kw: started.append(rank) or start(cfg, rank, **kw))
    replica = fake_config(**{"compilation_config.cudagraph_mode": cg.CUDAGraphMode.FULL_DECODE_ONLY,
                             **{f"parallel_config.{k}": v for k, v in parallel.items()}})
    log, session, *_ = worker_env("load", state=state, archive_names=names, config=replica)
    return started, log, session


def test_dense_replica_owns_its_global_rank_and_agrees_alone(worker_env, fake_vllm, tp_peer, monkeypatch):
    monkeypatch.setenv("FOUNDRY_VLLM_DP_SIZE", "2")  # exported by `vllm serve --data-parallel-size 2`
    # What vLLM 0.25 hands replica 1 of a dense model: data parallel size 1, rank 0, index 1.
    started, log, session = _load_as_replica(worker_env, fake_vllm, monkeypatch, data_parallel_index=1)
    assert started == [1] and session.mode is Mode.LOAD and not _fallbacks(log)
    assert tp_peer["calls"] == []  # its world is its own: no collective meets the other replica


def test_moe_replica_owns_its_global_rank_and_agrees_with_the_other_replica(worker_env, fake_vllm, tp_peer,
                                                                           monkeypatch):
    # What vLLM 0.25 hands replica 1 of a MoE model: data parallel size 2 and rank 1 kept, one world.
    started, log, session = _load_as_replica(worker_env, fake_vllm, monkeypatch, data_parallel_size=2,
                                             data_parallel_rank=1, enable_expert_parallel=True)
    assert started == [1] and session.mode is Mode.LOAD and not _fallbacks(log)
    # The replicas share collectives inside the graphs: every LOAD decision is the world's.
    assert tp_peer["calls"] and all(group == "world" for _, group in tp_peer["calls"])


def test_the_archives_caches_are_placed_before_vllms_first_forward(worker_env, fake_vllm, monkeypatch):
    cg = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"]
    assert runtime.WorkerRuntime.places_caches_ahead  # LOAD places them on a thread: the seams join it
    monkeypatch.setattr(runtime.WorkerRuntime, "wait_caches", lambda self: cg.LOG.append("wait_caches"))
    log, *_ = worker_env("save")  # profiles: both forwards' seams wait
    steps = [e if isinstance(e, str) else e[0] for e in log]
    assert steps.index("wait_caches") < steps.index("profile_run")
    second = steps.index("wait_caches", steps.index("profile_run"))
    assert second < steps.index("forward")


def test_unsupported_configuration_is_refused_before_the_device(worker_env, fake_vllm):
    cg = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"]
    cfg = fake_config(**{"compilation_config.cudagraph_mode": cg.CUDAGraphMode.PIECEWISE})
    with pytest.raises(modes.UnsupportedConfigError, match="cudagraph_mode=PIECEWISE"):
        worker_env("save", config=cfg)
    assert "set_device" not in cg.LOG


def test_worker_without_preload_is_refused(worker_env, monkeypatch):
    monkeypatch.setattr(worker_patches, "preload_active", lambda: False)
    with pytest.raises(StateError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        worker_env("save")


def test_foundry_off_leaves_vllm_alone(worker_env, fake_vllm, monkeypatch):
    cg = fake_vllm["vllm.v1.worker.gpu.cudagraph_utils"]
    monkeypatch.setenv("FOUNDRY_MODE", "off")
    worker = fake_vllm["vllm.v1.worker.gpu_worker"].Worker(fake_config())
    cg.LOG.clear()
    worker.init_device()
    assert worker.determine_available_memory() == 1000
    worker.initialize_from_config(types.SimpleNamespace(num_blocks=3))
    worker.compile_or_warm_up_model()
    assert runtime.current() is None and "profile_run" in cg.LOG and "kernel_warmup" in cg.LOG
    assert all(isinstance(g, FakeCUDAGraph) and not g.keep_graph
               for g in worker.model_runner.cudagraph_manager.graphs.values())


def test_import_checker_accepts_the_fake_vllm_and_rejects_changes(fake_vllm):
    from vllm_foundry import contract

    faked = [s for s in seams.SEAMS if s.module in fake_vllm]
    assert len(faked) >= 14
    assert {s.name: contract._check_import(s) for s in faked} == {s.name: None for s in faked}
    worker = fake_vllm["vllm.v1.worker.gpu_worker"].Worker
    worker.initialize_from_config = lambda self, config: None
    problem = contract._check_import(seams.seam("worker.initialize_from_config"))
    assert problem and "expected to start with (self, kv_cache_config)" in problem


def test_the_entry_points_import_leaves_the_worker_side_to_the_engine_processes():
    # The API server imports the plugin on its critical path; the worker and capture seams, the
    # session and the graph archive are imported by the processes that run a worker.
    import subprocess

    code = ("import sys, vllm_foundry.register; "
            "print(sorted(m for m in ('vllm_foundry.capture_patches', 'vllm_foundry.worker_patches', "
            "'vllm_foundry.runtime', 'foundry_core.engine.session', 'foundry_core.graphs') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
