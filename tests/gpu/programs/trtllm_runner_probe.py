"""One start of a TensorRT-LLM-shaped decode engine under trtllm-foundry, in a fresh process:
``trtllm_runner_probe.py save|load DIR``. No TensorRT-LLM is imported.

``StandInRunner`` follows ``CUDAGraphRunner``'s contract (TensorRT-LLM 1.2 cuda_graph_runner.py):
shared static input buffers sliced into each capture and copied into at replay, per-key
``graph_metadata``, ``WARMUP_STEPS = 2`` eager forwards, then one capture into one private pool
that every graph shares (``memory_pool = graph.pool()``), and outputs kept as non-owning views.
``StandInEngine`` drives it as ``PyTorchModelEngine`` does: largest batch first, each forward builds
the key's attention metadata, captures when the runner has no graph for the key, then replays.

The plugin's real seams wrap them: ``capture_patches.wrap_capture`` around ``capture``,
``wrap_cuda_graph_warmup`` around the capture loop and ``wrap_warmup`` around the warmup, under the
plugin's runtime (a real EngineSession, the deterministic region, save_graphs / load_graphs). SAVE
captures and writes the archive; LOAD restores it into the runner's own tables and captures
nothing. Both then run the same fresh decode batches through the engine's forward (replays) and
print a digest of every output byte, the number of captures and of eager forwards in the warmup.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
from pathlib import Path

import torch

from _common import emit

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "trtllm_foundry"))

from trtllm_foundry import capture_patches, restore, runtime  # noqa: E402
from trtllm_foundry.runtime import Phase  # noqa: E402

BATCH_SIZES = [1, 2, 3, 4, 8, 16]
VOCAB, HIDDEN, LAYERS = 512, 256, 3
COUNTS = {"captures": 0, "forwards": 0}


class _View:
    """A non-owning CUDA view of ``t``'s memory (what make_weak_ref's TensorWrapper does)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {"data": (t.data_ptr(), False), "shape": tuple(t.shape),
                                         "typestr": {torch.float32: "<f4", torch.int32: "<i4"}[t.dtype],
                                         "strides": tuple(s * t.element_size() for s in t.stride()), "version": 3}


def make_weak_ref(x):
    if isinstance(x, dict):
        return {k: make_weak_ref(v) for k, v in x.items()}
    return torch.as_tensor(_View(x), device="cuda")


class StandInRunner:
    WARMUP_STEPS = 2

    def __init__(self, max_tokens: int) -> None:
        self.graphs: dict = {}
        self.graph_outputs: dict = {}
        self.graph_metadata: dict = {}
        self.memory_pool = None
        self.shared_static_tensors = {"input_ids": torch.ones((max_tokens,), device="cuda", dtype=torch.int32),
                                      "position_ids": torch.zeros((1, max_tokens), device="cuda", dtype=torch.int32)}

    def needs_capture(self, key) -> bool:
        return key not in self.graph_outputs

    def capture(self, key, forward_fn, initial_inputs, enable_spec_decode=False, postprocess_fn=None):
        n = key[0]
        capture_inputs = dict(initial_inputs)
        capture_inputs.update(input_ids=self.shared_static_tensors["input_ids"][:n],
                              position_ids=self.shared_static_tensors["position_ids"][:, :n])
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
        n = current_inputs["input_ids"].shape[0]
        self.shared_static_tensors["input_ids"][:n].copy_(current_inputs["input_ids"])
        self.shared_static_tensors["position_ids"][:, :n].copy_(current_inputs["position_ids"])
        self.graphs[key].replay()
        return self.graph_outputs[key]


class StandInEngine:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.embed = torch.randn(VOCAB, HIDDEN, device="cuda") * 0.1
        self.layers = [torch.randn(HIDDEN, HIDDEN, device="cuda") * HIDDEN ** -0.5 for _ in range(LAYERS)]
        self.head = torch.randn(HIDDEN, VOCAB, device="cuda") * HIDDEN ** -0.5
        self.cuda_graph_runner = StandInRunner(max(BATCH_SIZES))
        self.metadata: dict = {}
        self.llm_args = types.SimpleNamespace(enable_autotuner=False)

    def _model_forward(self, inputs):
        COUNTS["forwards"] += 0 if torch.cuda.is_current_stream_capturing() else 1
        seq_lens = inputs["attn_metadata"].seq_lens
        h = self.embed[inputs["input_ids"].long()] * (1.0 + inputs["position_ids"][0, :, None].float() / 64)
        h = h * (seq_lens[:, None].float() / 128 + 1)
        for w in self.layers:
            h = torch.nn.functional.silu(h @ w) + h
        return {"logits": h @ self.head}

    def forward(self, input_ids, position_ids, seq_lens):
        key = (input_ids.shape[0], 0, False, False)
        if key not in self.metadata:  # the key's own metadata, made once (create_cuda_graph_metadata)
            self.metadata[key] = types.SimpleNamespace(seq_lens=torch.zeros(key[0], device="cuda", dtype=torch.int32))
        meta = self.metadata[key]
        meta.seq_lens.copy_(seq_lens)  # prepare(): the graph reads the metadata buffer
        inputs = {"attn_metadata": meta, "spec_metadata": None, "input_ids": input_ids, "position_ids": position_ids}
        runner = self.cuda_graph_runner
        if runner.needs_capture(key):
            runner.capture(key, self._model_forward, inputs)
        return runner.replay(key, inputs)

    def _run_cuda_graph_warmup(self, resource_manager):
        for bs in sorted(BATCH_SIZES, reverse=True):
            ids = torch.zeros(bs, device="cuda", dtype=torch.int32)
            self.forward(ids, ids[None], torch.ones(bs, device="cuda", dtype=torch.int32))
            torch.cuda.synchronize()

    def warmup(self, resource_manager):
        self._run_cuda_graph_warmup(resource_manager)


def _counting_graph(graph_ctx):
    def graph(*args, **kwargs):
        COUNTS["captures"] += 1
        return graph_ctx(*args, **kwargs)
    return graph


def main(mode: str, directory: str) -> dict:
    os.environ.update(FOUNDRY_ARCHIVE=str(Path(directory) / "archive"), FOUNDRY_MODE=mode)
    torch.cuda.init()
    torch.cuda.set_device(0)
    # The plugin's real wrappers, as the import hook installs them on CUDAGraphRunner / PyTorchModelEngine.
    StandInRunner.capture = capture_patches.wrap_capture(StandInRunner.capture)
    StandInEngine._run_cuda_graph_warmup = capture_patches.wrap_cuda_graph_warmup(StandInEngine._run_cuda_graph_warmup)
    StandInEngine.warmup = capture_patches.wrap_warmup(StandInEngine.warmup)
    llm_args = types.SimpleNamespace(model="stand-in-mlp", dtype="float32", enable_autotuner=False,
                                     cuda_graph_config=types.SimpleNamespace(batch_sizes=BATCH_SIZES),
                                     max_batch_size=max(BATCH_SIZES), max_num_tokens=max(BATCH_SIZES))
    rt = runtime.start(llm_args, 0)
    assert rt is not None, "Foundry is off"
    rt.boundary()  # as at PyTorchModelEngine.__init__: before the weights
    rt.create_blas_workspaces()
    torch.cuda.graph = _counting_graph(torch.cuda.graph)
    engine = StandInEngine()
    # What the KV seams record for a real engine (this stand-in has no KV cache).
    rt.adapter.state.update(kv_cache_blocks=0, kv_cache_bytes=0)
    rt.phase = Phase.FINAL
    with torch.inference_mode():
        engine.warmup(None)
        warmup = dict(COUNTS)
        restored = all(isinstance(g, restore.RestoredRunnerGraph) for g in engine.cuda_graph_runner.graphs.values())
        digest = hashlib.sha256()
        gen = torch.Generator(device="cuda").manual_seed(1234)
        for step in range(3):
            for bs in BATCH_SIZES:
                ids = torch.randint(0, VOCAB, (bs,), device="cuda", dtype=torch.int32, generator=gen)
                pos = torch.randint(0, 64, (1, bs), device="cuda", dtype=torch.int32, generator=gen)
                lens = torch.randint(1, 128, (bs,), device="cuda", dtype=torch.int32, generator=gen)
                out = engine.forward(ids, pos, lens)["logits"]
                torch.cuda.synchronize()
                digest.update(out.cpu().numpy().tobytes())
    return {"mode": rt.mode.value, "saved": rt.saved, "restored": rt.restored, "all_restored": restored,
            "graphs": len(engine.cuda_graph_runner.graphs), "captures": warmup["captures"],
            "forwards": warmup["forwards"], "fallbacks": rt.adapter.fallback_reasons, "digest": digest.hexdigest()}


if __name__ == "__main__":
    emit(main(sys.argv[1], sys.argv[2]))
