"""Shapes of the built-in decoder (importable without PyTorch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DecoderConfig:
    hidden: int = 1024
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 64
    intermediate: int = 2816
    layers: int = 4
    vocab: int = 32000
    context: int = 256
    max_batch: int = 256
    dtype: str = "bfloat16"
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


SHAPES = {
    # Small enough for a demo that finishes in well under a minute.
    "small": DecoderConfig(),
    # An 8B-class decoder layer stack (Qwen3-8B / Llama-3-8B shapes).
    "8b": DecoderConfig(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288, layers=36,
                        vocab=151936, context=512),
}
