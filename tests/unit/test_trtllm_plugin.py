"""trtllm-foundry without TensorRT-LLM: mode refusal, adapter fingerprint, outputs, the restore
helpers, the CLI options, and the SAVE / LOAD flows of the worker and capture seams over the
synthetic TensorRT-LLM of test_trtllm_fake.py (real module paths, 1.2's control flow), patched
through the plugin's own import hook.

The flows run the real EngineSession (mode resolution, fingerprint, engine_state.json written and
read back, fallback policy) over a region runtime without a GPU (test_engine_support.FakeRuntime),
a torch with only the CUDA-graph names, and stand-ins for save_graphs / load_graphs that keep the
saved graphs' output tensors."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import types
from typing import Any

import pytest

from plugin_support import FakeDevice, clear_environment, install_fake_torch, saved_logger, session_fingerprint
from test_engine_support import FakeRuntime, PluginArchiveIO
from test_trtllm_fake import write_tree

from foundry_core.engine import Mode
from foundry_core.engine.layout import rank_dir
from foundry_core.engine.state import read_state
from foundry_core.errors import InvalidArgumentError, MismatchError, StateError, UnsupportedError

from trtllm_foundry import (adapter as adapter_mod, capture_patches, cli, importhook, llm_patches, modes, options,
                            outputs, patching, restore, runtime, worker_patches)

FOUNDRY_ENV = ("FOUNDRY_ARCHIVE", "FOUNDRY_MODE", "FOUNDRY_STRICT", "FOUNDRY_FALLBACK", "FOUNDRY_TRTLLM_INSTANTIATE",
               "FOUNDRY_TRTLLM_CHECK_METADATA", "FOUNDRY_TRTLLM_WARMUP_FORWARDS", "TLLM_AUTOTUNER_CACHE_PATH",
               "TLLM_DISABLE_MPI", "LD_PRELOAD", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_RUNTIME_CONNECT",
               "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    clear_environment(monkeypatch, FOUNDRY_ENV)
    runtime.reset()
    # The plugin gives the foundry logger a stderr handler unless it has one: give it one that
    # keeps records flowing to caplog, and put the logger back afterwards for the next tests.
    with saved_logger("foundry") as log:
        log.addHandler(logging.NullHandler())
        log.propagate = True
        yield
    patching.uninstall_all()
    importhook.uninstall()
    runtime.reset()
    llm_patches._reset_for_tests()
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def llm_args(**fields: Any) -> types.SimpleNamespace:
    """TorchLlmArgs as the validators leave them, for the fields the plugin reads."""
    base = dict(model="/models/tiny", backend="pytorch", dtype="bfloat16", tensor_parallel_size=1,
                pipeline_parallel_size=1, context_parallel_size=1, moe_expert_parallel_size=None, cp_config={},
                cuda_graph_config=types.SimpleNamespace(batch_sizes=[1, 2, 4], enable_padding=False,
                                                        max_batch_size=4),
                kv_cache_config=types.SimpleNamespace(max_tokens=None, max_gpu_total_bytes=0,
                                                      free_gpu_memory_fraction=0.9),
                enable_autotuner=True, allreduce_strategy="AUTO", torch_compile_config=None, speculative_config=None,
                max_batch_size=4, max_num_tokens=256, max_seq_len=128)
    base.update(fields)
    return types.SimpleNamespace(**base)


# ---- modes -----------------------------------------------------------------------------------------


def test_modes_accept_the_supported_configuration():
    assert modes.unsupported_settings(llm_args(), environ={}) == []


def test_modes_name_every_unsupported_setting_at_once():
    args = llm_args(torch_compile_config=object(), tensor_parallel_size=2, pipeline_parallel_size=2,
                    moe_expert_parallel_size=4, cp_config={"cp_type": types.SimpleNamespace(name="HELIX")},
                    allreduce_strategy=types.SimpleNamespace(name="MNNVL"), orchestrator_type="ray",
                    speculative_config=object(), lora_config=object(), enable_sleep=True, enable_attention_dp=True,
                    kv_connector_config=object(), cuda_graph_config=None, backend="tensorrt")
    problems = modes.unsupported_settings(args, environ={"TLLM_DISABLE_MPI": "1"})
    text = " | ".join(problems)
    for name in ("torch.compile", "tensor_parallel_size=2", "pipeline_parallel_size=2", "moe_expert_parallel_size=4",
                 "cp_type=HELIX", "allreduce_strategy=MNNVL", "Ray orchestration", "speculative decoding", "LoRA",
                 "sleep mode", "attention data parallelism", "KV connector", "cuda_graph_config=None",
                 "backend='tensorrt'", "TLLM_DISABLE_MPI=1"):
        assert name in text, name
    assert len(problems) == 15
    with pytest.raises(modes.UnsupportedConfigError, match="FOUNDRY_MODE=off"):
        modes.check_supported(args, environ={})


# ---- adapter -----------------------------------------------------------------------------------------


def test_adapter_fingerprint_fields(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    adapter = adapter_mod.TrtllmAdapter(llm_args(model=str(model)), engine_version="1.2.1",
                                        environ={"TRTLLM_ENABLE_PDL": "1"})
    fp = session_fingerprint(adapter)
    assert fp["engine.name"] == "tensorrt_llm" and fp["engine.version"] == "1.2.1"
    assert fp["engine.capture_sizes"] == [4, 2, 1]
    assert (fp["engine.tp"], fp["engine.pp"], fp["engine.ep"]) == (1, 1, 1)
    assert fp["engine.knob.allreduce_strategy"] == "AUTO" and json.loads(fp["engine.knob.env"]) == {"TRTLLM_ENABLE_PDL": "1"}
    assert adapter.foundry_model_identity()["config_json_sha256"]
    (model / "config.json").write_text('{"hidden_size": 128}')
    assert session_fingerprint(adapter)["engine.model_hash"] != fp["engine.model_hash"]  # a changed config is a new model


def test_adapter_record_state_needs_the_kv_cache():
    adapter = adapter_mod.TrtllmAdapter(llm_args(), engine_version="1.2.1")
    assert adapter.foundry_record_state() is None
    adapter.state.update(kv_cache_blocks=8, kv_cache_bytes=1024)
    assert adapter.foundry_record_state() == {"kv_cache_blocks": 8, "kv_cache_bytes": 1024}


# ---- outputs and restore helpers ----------------------------------------------------------------------


class T:
    is_cuda = True

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def test_outputs_flatten_and_rebuild():
    logits, hidden = T(0x100), T(0x200)
    for out in (logits, {"logits": logits, "hidden": None, "h": hidden}, (logits, None, hidden), [hidden]):
        tensors, layout = outputs.flatten(out)
        rebuilt = outputs.rebuild(json.loads(json.dumps(layout)), tuple(T(t.ptr) for t in tensors))
        plain = lambda x: x.ptr if isinstance(x, T) else x  # noqa: E731
        if isinstance(out, dict):
            assert {k: plain(v) for k, v in rebuilt.items()} == {k: plain(v) for k, v in out.items()}
        elif isinstance(out, (tuple, list)):
            assert type(rebuilt) is type(out) and [plain(v) for v in rebuilt] == [plain(v) for v in out]
        else:
            assert rebuilt.ptr == logits.ptr
    with pytest.raises(UnsupportedError, match=r"\['n'\] is a int"):
        outputs.flatten({"n": 3})
    with pytest.raises(MismatchError, match="holds 1"):
        outputs.rebuild({"kind": "dict", "items": {"a": 1}}, (T(1),))


def test_restore_address_checks():
    saved = {"static[input_ids]": 0x10, ".kv": 0x20}
    assert restore.address_problem("g", saved, dict(saved)) is None
    problem = restore.address_problem("g", saved, {"static[input_ids]": 0x11})
    assert "static[input_ids] at 0x11, at SAVE 0x10" in problem and ".kv is missing" in problem
    assert restore.moved_inputs("g", saved, dict(saved)) is None
    assert "created the inputs .new" in restore.moved_inputs("g", saved, {**saved, ".new": 0x30})


def test_options_are_validated(monkeypatch):
    assert options.warmup_forwards() == "paused" and options.instantiate_mode() == ("eager", 4)
    monkeypatch.setenv("FOUNDRY_TRTLLM_WARMUP_FORWARDS", "elsewhere")
    with pytest.raises(InvalidArgumentError, match="paused, region"):
        options.warmup_forwards()
    monkeypatch.setenv("FOUNDRY_TRTLLM_INSTANTIATE", "lazy")
    assert options.instantiate_mode()[0] == "lazy"


# ---- the SAVE / LOAD flows over the synthetic TensorRT-LLM ---------------------------------------------


class FakeCUDAGraph:
    def __init__(self, *a, **k):
        self.name = type(self).__name__

    def pool(self):
        return ("pool", id(self))

    def replay(self):
        sys.modules["tensorrt_llm._fake"].LOG.append(("graph_replay", self.name))

    def reset(self):
        pass


class KeepGraph(FakeCUDAGraph):
    """Foundry's graph class as keep_graphs() puts it in torch.cuda during SAVE."""


@contextlib.contextmanager
def graph_context(graph, pool=None, **_kw):
    knobs = sys.modules["tensorrt_llm._fake"].KNOBS
    knobs["capturing"] = True
    sys.modules["tensorrt_llm._fake"].LOG.append(("capture", type(graph).__name__))
    try:
        yield
    finally:
        knobs["capturing"] = False


class FakeRestored:
    def __init__(self, name, index):
        self.name, self.index = name, index

    def replay(self, stream=None):
        sys.modules["tensorrt_llm._fake"].LOG.append(("restored_replay", self.name))


class ArchiveIO(PluginArchiveIO):
    def __init__(self):
        super().__init__(KeepGraph, FakeRestored, lambda t: T(t.data_ptr()))


class RegionDevice(FakeDevice):
    """FakeDevice that also tells the synthetic allocator when the region is paused."""

    def stop_region(self) -> None:
        super().stop_region()
        sys.modules["tensorrt_llm._fake"].KNOBS["paused"] = True

    def resume_region(self) -> None:
        super().resume_region()
        sys.modules["tensorrt_llm._fake"].KNOBS["paused"] = False


@dataclasses.dataclass
class Run:
    log: list
    rt: Any
    executor: Any
    dev: list
    region: FakeRuntime

    def count(self, event) -> int:
        return sum(1 for e in self.log if e == event or (isinstance(e, tuple) and e[0] == event))


@pytest.fixture
def worker(monkeypatch, tmp_path):
    """The synthetic TensorRT-LLM on sys.path, patched through the import hook; returns
    ``start(mode, **llm_args)`` that runs one worker start-up (create_py_executor)."""
    import foundry_core.graphs
    import foundry_core.images

    write_tree(tmp_path / "src")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    torch = install_fake_torch(monkeypatch, FakeCUDAGraph, graph_context, KeepGraph)
    torch.cuda.is_current_stream_capturing = lambda: sys.modules["tensorrt_llm._fake"].KNOBS.get("capturing", False)
    io = ArchiveIO()
    monkeypatch.setattr(foundry_core.graphs, "save_graphs", io.save_graphs)
    monkeypatch.setattr(foundry_core.graphs, "load_graphs", io.load_graphs)
    monkeypatch.setattr(foundry_core.graphs, "open_archive", io.open_archive)
    monkeypatch.setattr(foundry_core.images, "load_cuda_modules_and_libraries", io.load_images)
    monkeypatch.setattr(worker_patches, "preload_active", lambda: True)
    monkeypatch.setattr(runtime.WorkerRuntime, "create_blas_workspaces",
                        lambda self: sys.modules["tensorrt_llm._fake"].LOG.append("blas_workspaces"))
    archive = tmp_path / "archive"
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(archive))
    importhook.install()
    from tensorrt_llm import _fake
    from tensorrt_llm._torch.pyexecutor import py_executor_creator

    def start(mode, knobs=None, **fields) -> Run:
        _fake.reset()
        _fake.KNOBS.update(knobs or {})
        sys.modules["tensorrt_llm._torch.autotuner"].AutoTuner._instance = None  # a fresh process's autotuner
        monkeypatch.setenv("FOUNDRY_MODE", mode)
        monkeypatch.delenv("TLLM_AUTOTUNER_CACHE_PATH", raising=False)
        dev_log: list = []
        region = FakeRuntime()
        monkeypatch.setattr(runtime, "DeviceOps", lambda: RegionDevice(dev_log))
        monkeypatch.setattr(runtime, "region_runtime", lambda: region)
        runtime.reset()
        executor = py_executor_creator.create_py_executor(llm_args(**fields), types.SimpleNamespace(rank=0))
        return Run(list(_fake.LOG), runtime.current(), executor, dev_log, region)

    start.io, start.archive = io, archive  # type: ignore[attr-defined]
    return start


NAMES = ["(4, 0, False, False)", "(2, 0, False, False)", "(1, 0, False, False)"]


def test_the_import_hook_patched_every_worker_seam(worker):
    worker  # the fixture imported the synthetic modules through the hook
    assert set(patching.installed_names()) == set(worker_patches.WRAPPERS) | set(capture_patches.WRAPPERS)


def test_save_flow(worker):
    run = worker("save")
    # Two executors as TensorRT-LLM builds them: the estimation pass (warmup, captures, profiling) and the final one.
    assert run.count("warmup") == 2 and run.count("profile") == 1
    assert run.log[:2] == ["blas_workspaces", "load_weights"]  # in the region, before the weights
    assert [c[0] for c in run.region.calls] == ["set_region", "seal", "stop"]  # boundary at once; stop after warmup
    # The final loop captured with Foundry's graphs, the estimation pass with torch's own.
    captures = [e[1] for e in run.log if isinstance(e, tuple) and e[0] == "capture"]
    assert captures == ["FakeCUDAGraph"] * 3 + ["KeepGraph"] * 3
    # Paused: the estimation pass (once), the autotuner forward, 2 warmup forwards of 3 graphs.
    assert run.dev.count("stop_region") == 1 + 1 + 6 == run.dev.count("resume_region")
    state = run.rt.adapter.state
    saved = worker.io.saved[rank_dir(worker.archive, 0)]
    assert list(saved) == NAMES == state["graphs"]
    assert state["outputs"][NAMES[0]] == {"kind": "dict", "items": {"logits": 0, "hidden": None}}
    assert set(state["input_addresses"][NAMES[0]]) == {"[static][input_ids]", "[static][position_ids]",
                                                       "[attn_metadata].block_ids", "[attn_metadata].kv_lens"}
    assert state["kv_cache_inputs"] == {"max_tokens": 8192, "max_gpu_total_bytes": 8192 * 1024}
    assert state["kv_cache_blocks"] == 256 and state["autotuner_cache"] == {"rank_0": {"gemm": [1, 7]}}
    assert run.rt.saved and run.rt.phase is runtime.Phase.SERVING and not run.rt.region_open
    assert read_state(rank_dir(worker.archive, 0)).adapter["kv_cache_inputs"]["max_tokens"] == 8192


def test_load_flow_restores_instead_of_capturing(worker, caplog):
    worker("save")
    with caplog.at_level(logging.INFO, logger="foundry"):
        run = worker("auto")
    assert run.rt.mode is Mode.LOAD and run.rt.restored == 3
    # No estimation pass, no profiling, no autotuner forward, no warmup or captured forward, no capture.
    assert run.count("warmup") == 1 and run.count("profile") == 0 and run.count("autotune_forward") == 0
    assert run.count("forward") == 0 and run.count("capture") == 0
    assert ("load_cache", 0) in run.log and run.log[:2] == ["blas_workspaces", "load_weights"]
    # TensorRT-LLM's own replay right after each "capture" replays the restored graph.
    assert [e[1] for e in run.log if isinstance(e, tuple) and e[0] == "restored_replay"] == NAMES
    runner = run.executor.engine.cuda_graph_runner
    assert all(isinstance(g, restore.RestoredRunnerGraph) for g in runner.graphs.values())
    saved = worker.io.saved[rank_dir(worker.archive, 0)]
    assert runner.graph_outputs[(4, 0, False, False)]["logits"].data_ptr() == saved[NAMES[0]][0].data_ptr()
    kv = run.executor.engine  # the final KV cache was built from SAVE's inputs
    assert run.rt.adapter.state["kv_cache_blocks"] == 256
    assert run.dev.count("stop_region") == 2  # the two skipped pauses (estimation, autotuner) flush as SAVE's did
    assert "restored 3 decode graphs" in caplog.text and kv is not None


def _fallback_reasons(run) -> list[str]:
    return run.rt.adapter.fallback_reasons


def test_load_falls_back_when_inputs_moved(worker):
    worker("save")
    run = worker("auto", knobs={"shift": 0x40})
    assert run.rt.mode is Mode.SAVE and run.rt.saved  # captured and wrote a fresh archive
    assert "[static][input_ids] at 0x11040, at SAVE 0x11000" in _fallback_reasons(run)[0]
    assert run.count("capture") == 3 and run.count("restored_replay") == 0


def test_load_falls_back_when_a_graph_is_missing(worker):
    worker("save")
    del worker.io.saved[rank_dir(worker.archive, 0)][NAMES[1]]
    run = worker("load")
    assert run.rt.mode is Mode.OFF and f"no graph {NAMES[1]!r}" in _fallback_reasons(run)[0]
    runner = run.executor.engine.cuda_graph_runner
    assert not any(isinstance(g, restore.RestoredRunnerGraph) for g in runner.graphs.values())
    assert len(runner.graphs) == 3  # TensorRT-LLM captured every graph itself


def test_load_falls_back_when_the_kv_cache_differs(worker):
    worker("save")
    run = worker("auto", knobs={"max_tokens_that_fit": 4096})
    assert "KV cache of 128 blocks" in _fallback_reasons(run)[0] and "256 blocks" in _fallback_reasons(run)[0]
    assert run.rt.mode is Mode.SAVE


def test_stale_archive_saves_a_fresh_one_naming_the_setting(worker):
    worker("save")
    run = worker("auto", max_num_tokens=512)
    assert "max_num_tokens" in _fallback_reasons(run)[0] and run.rt.saved
    assert run.count("profile") == 1  # a normal start: TensorRT-LLM estimates again


def test_explicit_load_without_an_archive_starts_normally(worker):
    run = worker("load")
    assert run.rt is None or run.rt.mode is Mode.OFF
    assert run.count("profile") == 1 and run.count("capture") == 6


def test_a_capture_whose_inputs_the_warmups_created_is_not_archived(worker, monkeypatch, caplog):
    engine_mod = sys.modules["tensorrt_llm._torch.pyexecutor.model_engine"]
    original = engine_mod.PyTorchModelEngine._model_forward

    def forward(self, inputs):
        inputs["attn_metadata"].workspace = sys.modules["tensorrt_llm._fake"].alloc()  # made lazily in a warmup
        return original(self, inputs)

    monkeypatch.setattr(engine_mod.PyTorchModelEngine, "_model_forward", forward)
    with caplog.at_level(logging.ERROR, logger="foundry"):
        run = worker("save")
    assert not run.rt.saved and not worker.io.saved
    assert "the warmup forwards created the inputs [attn_metadata].workspace" in caplog.text


def test_unsupported_configuration_is_refused_before_the_weights_load(worker):
    with pytest.raises(modes.UnsupportedConfigError, match="torch.compile"):
        worker("save", torch_compile_config=object())
    from tensorrt_llm import _fake

    assert "load_weights" not in _fake.LOG


def test_a_worker_without_the_preload_is_refused(worker, monkeypatch):
    monkeypatch.setattr(worker_patches, "preload_active", lambda: False)
    with pytest.raises(StateError, match=r"foundry run -- trtllm-serve MODEL"):
        worker("save")


def test_foundry_off_leaves_tensorrt_llm_alone(worker):
    run = worker("off")
    assert run.rt is None and run.count("capture") == 6 and run.count("profile") == 1


def test_the_llm_process_refuses_early_and_prepares_the_workers(worker, monkeypatch):
    monkeypatch.setattr(llm_patches, "plugin_child_environment",
                        lambda settings, **kw: {"LD_PRELOAD": "/opt/libfoundry.so", "FOUNDRY_STRICT": "1"})
    monkeypatch.setenv("FOUNDRY_MODE", "save")
    from tensorrt_llm import _fake
    from tensorrt_llm.llmapi import llm

    _fake.reset()
    with pytest.raises(modes.UnsupportedConfigError, match="tensor_parallel_size=2"):
        llm._TorchLLM(llm_args(tensor_parallel_size=2))
    assert "executor" not in _fake.LOG
    llm._TorchLLM(llm_args())
    assert _fake.LOG == ["executor"]
    import os

    assert os.environ["LD_PRELOAD"] == "/opt/libfoundry.so" and os.environ["FOUNDRY_STRICT"] == "1"


# ---- trtllm-serve options --------------------------------------------------------------------------


class FakeOption:
    def __init__(self, decls, **kw):
        self.opts, self.name, self.kw = decls[:-1], decls[-1], kw


def test_cli_options_are_added_once_and_exported(monkeypatch, tmp_path):
    fake_click = types.SimpleNamespace(Option=FakeOption, Choice=lambda c: ("choice", tuple(c)))
    calls = []
    serve = types.SimpleNamespace(params=[FakeOption(["--port", "port"])], callback=lambda model, port: calls.append(
        (model, port)))
    module = types.ModuleType("tensorrt_llm.commands.serve")
    module.serve = serve
    monkeypatch.setitem(sys.modules, "click", fake_click)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.commands.serve", module)
    assert cli.install() is True and cli.install() is False
    assert [p.name for p in serve.params] == ["port", "foundry_archive", "foundry_mode"]
    assert serve.params[2].kw["type"] == ("choice", ("auto", "save", "load", "off"))
    monkeypatch.chdir(tmp_path)
    serve.callback("tiny", port=1, foundry_archive="arch", foundry_mode="save")
    import os

    assert calls == [("tiny", 1)]
    assert os.environ["FOUNDRY_ARCHIVE"] == str(tmp_path / "arch") and os.environ["FOUNDRY_MODE"] == "save"
    cli.uninstall()
    assert [p.name for p in serve.params] == ["port"]


def test_cli_without_the_command_warns(monkeypatch, caplog):
    module = types.ModuleType("tensorrt_llm.commands.serve")
    module.serve = object()
    monkeypatch.setitem(sys.modules, "tensorrt_llm.commands.serve", module)
    with caplog.at_level(logging.WARNING, logger="foundry"):
        assert cli.install() is False
    assert "expected a click command" in caplog.text and "FOUNDRY_ARCHIVE" in caplog.text
