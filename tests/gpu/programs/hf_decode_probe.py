"""Decode steps of Hugging Face transformers models over a StaticCache: SAVE in one process, LOAD
in a fresh one.

Usage: hf_decode_probe.py save MODEL DIR | load MODEL DIR | capture MODEL

Each model is built from a small config with random weights (seed 0) right after the region is
set, then one StaticCache and one token buffer per batch size: the same allocations in the same
order in both processes. SAVE warms up, captures one decode step per batch size (largest first,
one pool) and saves them; LOAD restores them. Both then run the same decode on every graph: fresh
state (seeded tokens, cache contents, cache length), three replays each feeding its greedy token
back, and a hash of the logits of every step and of the caches after them. ``capture`` only
tries the capture and reports whether it worked (for a forward that cannot be captured).
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import torch

SIZES = [4, 2, 1]  # largest first, as engines capture
CACHE_LEN = 64
PREFIX = 5  # tokens already in the cache when a decode starts
STEPS = 3
VOCAB = 512


@dataclass
class Spec:
    """How one model is built: its config, weight dtype and attention/experts implementations."""

    config: Callable[[], Any]
    dtype: torch.dtype
    attention: str
    experts: str | None = None
    note: str = ""


def _dense(cls_name: str, **extra):
    def make():
        import transformers

        return getattr(transformers, cls_name)(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               max_position_embeddings=256, **extra)
    return make


def _gpt2():
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_embd=128, n_layer=2, n_head=4, n_positions=256, bos_token_id=0,
                      eos_token_id=0)


# SDPA attention throughout: transformers' eager attention builds its mask with
# torch.tensor(0.0, device=...) every step, a host-to-device copy that synchronizes the stream.
MODELS: dict[str, Spec] = {
    "llama": Spec(_dense("LlamaConfig"), torch.float16, "sdpa"),
    "qwen2": Spec(_dense("Qwen2Config"), torch.bfloat16, "sdpa"),
    "qwen3": Spec(_dense("Qwen3Config", head_dim=32), torch.bfloat16, "sdpa"),
    # Without a sliding window: StaticCache's sliding layers branch on a Python counter, which a
    # replayed graph cannot follow.
    "mistral": Spec(_dense("MistralConfig", sliding_window=None), torch.float16, "sdpa",
                    note="full attention (sliding_window=None)"),
    "gemma": Spec(_dense("GemmaConfig", head_dim=32), torch.bfloat16, "sdpa"),
    "gpt2": Spec(_gpt2, torch.float16, "sdpa"),
    "mixtral": Spec(_dense("MixtralConfig", num_local_experts=4, num_experts_per_tok=2), torch.bfloat16, "sdpa",
                    experts="grouped_mm", note="experts through grouped_mm"),
    "qwen3_moe": Spec(_dense("Qwen3MoeConfig", head_dim=32, num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=128), torch.bfloat16, "sdpa", experts="batched_mm",
                      note="experts through batched_mm"),
    # Forwards that cannot be captured, kept to show that they still cannot (``capture`` mode).
    "llama_eager_attention": Spec(_dense("LlamaConfig"), torch.float16, "eager"),
    "mixtral_eager_experts": Spec(_dense("MixtralConfig", num_local_experts=4, num_experts_per_tok=2),
                                  torch.bfloat16, "sdpa", experts="eager"),
}


@dataclass
class DecodeState:
    cache: Any  # a transformers StaticCache for one batch size
    tokens: torch.Tensor  # [batch, 1]


def build(name: str, device: str = "cuda") -> tuple[torch.nn.Module, dict[int, DecodeState]]:
    """The model (weights made on the CPU from seed 0, then moved) and a state per batch size."""
    from transformers import AutoModelForCausalLM, StaticCache

    spec = MODELS[name]
    torch.manual_seed(0)
    kwargs = {"experts_implementation": spec.experts} if spec.experts else {}
    model = AutoModelForCausalLM.from_config(spec.config(), dtype=spec.dtype, attn_implementation=spec.attention,
                                             **kwargs)
    model = model.to(device).eval()
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    states = {}
    for b in SIZES:
        cache = StaticCache(config=cfg, max_cache_len=CACHE_LEN)
        cache.early_initialization(batch_size=b, num_heads=heads, head_dim=head_dim, dtype=spec.dtype, device=device)
        states[b] = DecodeState(cache, torch.zeros(b, 1, dtype=torch.long, device=device))
    return model, states


def step(model: torch.nn.Module, s: DecodeState) -> torch.Tensor:
    """One decode step: the model's own forward over its StaticCache; returns the logits."""
    with torch.no_grad():
        return model(input_ids=s.tokens, past_key_values=s.cache, use_cache=True).logits


def reset(s: DecodeState, seed: int) -> None:
    """Seeded tokens and cache contents, and PREFIX tokens already seen, written in place."""
    device = s.tokens.device
    gen = torch.Generator(device=device).manual_seed(seed)
    s.tokens.copy_(torch.randint(0, VOCAB, s.tokens.shape, generator=gen, device=device))
    for layer in s.cache.layers:
        for t in (layer.keys, layer.values):
            t.copy_(torch.randn(t.shape, generator=gen, device=device, dtype=t.dtype))
        layer.cumulative_length.fill_(PREFIX)


def decode(run: Callable[[], None], logits: torch.Tensor, s: DecodeState, seed: int) -> dict:
    """STEPS greedy steps from a fresh state through ``run`` (a replay, or an eager step writing
    ``logits``); a hash of every step's logits and of the caches after them."""
    reset(s, seed)
    h = hashlib.sha256()
    for _ in range(STEPS):
        run()
        h.update(logits.contiguous().view(torch.uint8).cpu().numpy().tobytes())
        s.tokens.copy_(logits[:, -1].argmax(dim=-1, keepdim=True))
    for layer in s.cache.layers:
        for t in (layer.keys, layer.values):
            h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return {"digest": h.hexdigest(), "lengths": sorted({int(layer.cumulative_length) for layer in s.cache.layers})}


def decode_all(replays: dict[int, tuple[Callable[[], None], torch.Tensor]], states: dict[int, DecodeState]) -> dict:
    return {str(b): decode(run, logits, states[b], 1000 + b) for b, (run, logits) in replays.items()}


def eager_replays(model, states, logits) -> dict:
    """The graphs' decode run eagerly instead, each step's logits copied into a buffer of their own."""
    replays = {}
    for b in SIZES:
        holder = torch.empty_like(logits[b])
        replays[b] = ((lambda b=b, holder=holder: holder.copy_(step(model, states[b]))), holder)
    return replays


def capture(model, states) -> tuple[dict, dict, float]:
    """Warm-up, then one graph per batch size in one pool; (graphs, logits, seconds)."""
    import foundry_core as fdry

    start = time.perf_counter()
    for b in SIZES:
        reset(states[b], 7)
        for _ in range(2):
            step(model, states[b])
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    graphs, logits = {}, {}
    for b in SIZES:
        g = fdry.CUDAGraph()
        with fdry.graph(g, pool=pool):
            logits[b] = step(model, states[b])
        graphs[b] = g
    torch.cuda.synchronize()
    return graphs, logits, time.perf_counter() - start


def versions() -> dict:
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def save(name: str, directory: str) -> dict:
    import foundry_core as fdry
    from _common import REGION_BASE, REGION_SIZE

    torch.cuda.init()
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    model, states = build(name)
    graphs, logits, capture_s = capture(model, states)
    report = fdry.save_graphs(directory, {f"bs{b}": (graphs[b], logits[b]) for b in SIZES})
    decoded = decode_all({b: (graphs[b].replay, logits[b]) for b in SIZES}, states)
    eager = decode_all(eager_replays(model, states, logits), states)
    return {**versions(), "capture_s": capture_s, "eager": eager, "save_s": report.seconds, "graphs": report.graphs,
            "groups": report.groups, "nodes": report.nodes, "decoded": decoded, "note": MODELS[name].note,
            "cache_length_after": PREFIX + STEPS}


def load(name: str, directory: str) -> dict:
    import foundry_core as fdry
    from _common import REGION_BASE, REGION_SIZE

    torch.cuda.init()
    start = time.perf_counter()
    fdry.load_cuda_modules_and_libraries(directory)
    images_s = time.perf_counter() - start
    fdry.set_allocation_region(REGION_BASE, REGION_SIZE)
    model, states = build(name)
    torch.cuda.synchronize()
    start = time.perf_counter()
    archive = fdry.load_graphs(directory)
    restore_s = time.perf_counter() - start
    graphs = {b: archive.get(f"bs{b}") for b in SIZES}
    logits = {b: archive.outputs(graphs[b].index) for b in SIZES}
    decoded = decode_all({b: (graphs[b].replay, logits[b]) for b in SIZES}, states)
    return {**versions(), "images_s": images_s, "restore_s": restore_s, "groups": archive.groups, "decoded": decoded}


def try_capture(name: str) -> dict:
    """Whether one decode step can be captured at all; the error if not."""
    torch.cuda.init()
    model, states = build(name)
    try:
        capture(model, states)
    except Exception as exc:  # noqa: BLE001 - the capture's own error is the result
        cause = exc.__context__ if exc.__context__ is not None else exc
        return {**versions(), "captured": False, "error": f"{type(cause).__name__}: {cause}"[:2000],
                "final_error": f"{type(exc).__name__}: {exc}"[:2000]}
    return {**versions(), "captured": True}


if __name__ == "__main__":
    from _common import emit

    mode, name = sys.argv[1], sys.argv[2]
    if name not in MODELS:
        raise SystemExit(f"unknown model {name}; choose one of {', '.join(MODELS)}")
    if mode == "save":
        emit(save(name, sys.argv[3]))
    elif mode == "load":
        emit(load(name, sys.argv[3]))
    elif mode == "capture":
        emit(try_capture(name))
    else:
        raise SystemExit(__doc__)
