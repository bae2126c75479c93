"""Write a tiny mixture-of-experts model folder (Qwen2-MoE architecture), its config without weights.

Usage: python tiny_moe_model.py OUT_DIR TOKENIZER_DIR

TOKENIZER_DIR is a tiny Qwen3-style model folder (``tiny_model.py``'s, vocabulary 32000): its
tokenizer and generation files are copied, and ``config.json`` is a ``Qwen2MoeForCausalLM``
(hidden 1024, 8 layers, 16 heads of 64, 8 KV heads, 8 experts of 512 with 2 per token, a shared
expert of 1024, vocabulary 32000). vLLM 0.25 runs this architecture on its V2 model runner by
default (``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``). No weights are written here: ``random_weights.py``
(beside the recipes) adds random ones, or vLLM's dummy loader fills them (``--load-format dummy``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def moe_config(vocab_size: int) -> dict:
    return {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_size": 1024,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "intermediate_size": 2048,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 1024,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": False,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 8,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "torch_dtype": "bfloat16",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("tokenizer_dir", type=Path, help="a tiny Qwen3-style model folder written by tiny_model.py")
    args = parser.parse_args()
    missing = [n for n in ("config.json", *COPIED) if not (args.tokenizer_dir / n).is_file()]
    if missing:
        raise SystemExit(f"{args.tokenizer_dir} lacks {', '.join(missing)}: pass a folder written by "
                         "tiny_model.py (python tiny_model.py DIR)")
    vocab = json.loads((args.tokenizer_dir / "config.json").read_text())["vocab_size"]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copyfile(args.tokenizer_dir / name, args.out_dir / name)
    (args.out_dir / "config.json").write_text(json.dumps(moe_config(vocab), indent=2) + "\n")


if __name__ == "__main__":
    main()
