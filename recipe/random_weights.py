"""Write random weights of a normal scale for a small model folder, so its outputs depend on the prompt.

Usage: python random_weights.py MODEL_DIR [--seed 0] [--max-params 1000000000]

An engine's dummy loader fills every weight with tiny values (vLLM: uniform in +-1e-3), so the
residual stream barely moves: every prompt gets the same completion and a restored graph that
read the wrong KV cache would still print it. Here every matrix is drawn from N(0, std) with the
config's ``initializer_range`` and every norm weight is 1, as a freshly initialised model; its
attention and MLP outputs dominate the residual, so completions and log-probabilities follow the
context. Writes MODEL_DIR/model.safetensors (bfloat16) for the architectures the recipes use:
Qwen3 and Llama (dense) and Qwen2-MoE. Exit status 3, writing nothing, for a model over
``--max-params`` (the 8B shapes keep their dummy weights: 16 GB of random numbers would measure
nothing more); 2 for a config it does not cover.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

Shapes = dict[str, tuple[int, ...]]
TOO_LARGE = 3  # exit status: over --max-params, nothing written


def _attention(p: str, c: dict, bias: bool, qk_norm: bool) -> Shapes:
    hidden, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    out = {f"{p}.q_proj.weight": (heads * head_dim, hidden), f"{p}.k_proj.weight": (kv * head_dim, hidden),
           f"{p}.v_proj.weight": (kv * head_dim, hidden), f"{p}.o_proj.weight": (hidden, heads * head_dim)}
    if bias:
        out.update({f"{p}.q_proj.bias": (heads * head_dim,), f"{p}.k_proj.bias": (kv * head_dim,),
                    f"{p}.v_proj.bias": (kv * head_dim,)})
    if qk_norm:
        out.update({f"{p}.q_norm.weight": (head_dim,), f"{p}.k_norm.weight": (head_dim,)})
    return out


def _mlp(p: str, hidden: int, inner: int) -> Shapes:
    return {f"{p}.gate_proj.weight": (inner, hidden), f"{p}.up_proj.weight": (inner, hidden),
            f"{p}.down_proj.weight": (hidden, inner)}


def _moe(p: str, c: dict) -> Shapes:
    hidden, experts = c["hidden_size"], c["num_experts"]
    out = {f"{p}.gate.weight": (experts, hidden), f"{p}.shared_expert_gate.weight": (1, hidden)}
    for e in range(experts):
        out.update(_mlp(f"{p}.experts.{e}", hidden, c["moe_intermediate_size"]))
    if c.get("shared_expert_intermediate_size"):
        out.update(_mlp(f"{p}.shared_expert", hidden, c["shared_expert_intermediate_size"]))
    return out


def _sparse(c: dict, layer: int) -> bool:
    step = c.get("decoder_sparse_step", 1)
    return layer not in c.get("mlp_only_layers", []) and step > 0 and (layer + 1) % step == 0


def weight_shapes(config: dict) -> Shapes:
    """Checkpoint names and shapes (Hugging Face layout) of the config's model."""
    kind = config.get("model_type")
    if kind not in ("qwen3", "llama", "qwen2_moe"):
        raise ValueError(f"random weights cover qwen3, llama and qwen2_moe configs, not model_type {kind!r}")
    if kind == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise ValueError("random weights cover Llama without attention_bias and mlp_bias")
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    shapes: Shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (hidden,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (hidden,)
        shapes.update(_attention(f"{p}.self_attn", config, bias=kind == "qwen2_moe", qk_norm=kind == "qwen3"))
        if kind == "qwen2_moe" and _sparse(config, i):
            shapes.update(_moe(f"{p}.mlp", config))
        else:
            shapes.update(_mlp(f"{p}.mlp", hidden, config["intermediate_size"]))
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def parameter_count(shapes: Shapes) -> int:
    total = 0
    for shape in shapes.values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def write_safetensors(path: Path, tensors: dict) -> None:
    """bfloat16 tensors (numpy uint16 arrays of the bit patterns) in the safetensors layout:
    an 8-byte little-endian header length, the JSON header, then the data back to back."""
    header, offset = {}, 0
    for name, array in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for array in tensors.values():
            f.write(array.tobytes())
    tmp.replace(path)  # a run cut short leaves no half-written weights behind


def to_bfloat16(values):
    """float32 numpy values as bfloat16 bit patterns (uint16), rounded to nearest even."""
    import numpy as np

    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def random_tensors(shapes: Shapes, std: float, seed: int) -> dict:
    """N(0, std) matrices and vectors, norm weights of 1, as bfloat16 bit patterns."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {name: to_bfloat16(np.ones(shape, np.float32) if is_norm(name)
                              else rng.standard_normal(shape, np.float32) * np.float32(std))
            for name, shape in shapes.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-params", type=int, default=1_000_000_000)
    args = parser.parse_args(argv)
    config = json.loads((args.model_dir / "config.json").read_text())
    try:
        shapes = weight_shapes(config)
    except (ValueError, KeyError) as exc:
        print(f"random_weights: {args.model_dir}/config.json: {exc}", file=sys.stderr)
        return 2
    count = parameter_count(shapes)
    if count > args.max_params:
        print(f"random_weights: {count:,} parameters is over --max-params {args.max_params:,}; "
              "keep the engine's dummy weights for this model", file=sys.stderr)
        return TOO_LARGE
    write_safetensors(args.model_dir / "model.safetensors",
                      random_tensors(shapes, config.get("initializer_range", 0.02), args.seed))
    print(f"random_weights: {count:,} parameters (std {config.get('initializer_range', 0.02)}, seed {args.seed}) "
          f"in {args.model_dir / 'model.safetensors'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
