"""A Llama/Qwen3-style decoder in plain PyTorch, for decode steps (one token per sequence).

RMSNorm, fused QKV projection, rotary embedding, grouped-query attention over a static KV cache,
gated SiLU MLP, residuals, LM head and greedy argmax. Weights are random (seeded), so two
processes building the same config get identical weights at identical addresses (under the
allocation region) and identical outputs.
"""

from __future__ import annotations

import torch

from foundry_core.model.config import DecoderConfig


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    var = x.float().pow(2).mean(dim=-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Decoder:
    """Weights and KV cache of the model; :meth:`step` runs one decode step for a batch."""

    def __init__(self, cfg: DecoderConfig, device: str = "cuda"):
        self.cfg = cfg
        dt = getattr(torch, cfg.dtype)
        gen = torch.Generator(device=device).manual_seed(cfg.seed)

        def w(*shape, scale=0.02):
            return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dt)

        qkv_out = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
        self.embed = w(cfg.vocab, cfg.hidden, scale=1.0)
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append({
                "attn_norm": torch.ones(cfg.hidden, device=device, dtype=dt),
                "qkv": w(qkv_out, cfg.hidden),
                "o": w(cfg.hidden, cfg.heads * cfg.head_dim),
                "mlp_norm": torch.ones(cfg.hidden, device=device, dtype=dt),
                "gate_up": w(2 * cfg.intermediate, cfg.hidden),
                "down": w(cfg.hidden, cfg.intermediate),
            })
        self.final_norm = torch.ones(cfg.hidden, device=device, dtype=dt)
        self.lm_head = w(cfg.vocab, cfg.hidden)
        shape = (cfg.layers, cfg.max_batch, cfg.kv_heads, cfg.context, cfg.head_dim)
        self.k_cache = torch.empty(shape, device=device, dtype=dt)
        self.v_cache = torch.empty(shape, device=device, dtype=dt)
        self.reset_cache()
        inv = 1.0 / (10000 ** (torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim))
        freqs = torch.outer(torch.arange(cfg.context, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = freqs.cos().to(dt), freqs.sin().to(dt)
        self.ctx_index = torch.arange(cfg.context, device=device)

    def reset_cache(self) -> None:
        """Refills the KV cache with its initial (seeded) values, in place."""
        gen = torch.Generator(device=self.k_cache.device).manual_seed(self.cfg.seed + 1)
        for cache in (self.k_cache, self.v_cache):
            cache.copy_(torch.randn(cache.shape, generator=gen, device=cache.device, dtype=torch.float32).to(cache.dtype))

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(next tokens by greedy argmax, logits) for ``tokens[b]`` at ``positions[b]``; writes the KV cache."""
        cfg = self.cfg
        b = tokens.shape[0]
        x = self.embed[tokens]
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        rows = torch.arange(b, device=tokens.device)
        # Attend to positions up to and including the current one.
        mask = torch.where(self.ctx_index[None, :] <= positions[:, None], 0.0, float("-inf"))[:, None, None, :]
        group = cfg.heads // cfg.kv_heads
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer["attn_norm"])
            qkv = h @ layer["qkv"].t()
            q, k, v = qkv.split([cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim], -1)
            q = _rotate(q.view(b, cfg.heads, cfg.head_dim), cos, sin)
            k = _rotate(k.view(b, cfg.kv_heads, cfg.head_dim), cos, sin)
            self.k_cache[i, rows, :, positions] = k
            self.v_cache[i, rows, :, positions] = v.view(b, cfg.kv_heads, cfg.head_dim)
            # Grouped-query attention without materialising repeated keys: the query heads of one
            # KV head attend together.
            q = q.view(b, cfg.kv_heads, group, cfg.head_dim)
            scores = (q @ self.k_cache[i, :b].transpose(-1, -2)).float() * cfg.head_dim**-0.5 + mask
            attn = (torch.softmax(scores, dim=-1).to(x.dtype) @ self.v_cache[i, :b]).reshape(b, cfg.heads * cfg.head_dim)
            x = x + attn @ layer["o"].t()
            h = _rms_norm(x, layer["mlp_norm"])
            gate, up = (h @ layer["gate_up"].t()).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ layer["down"].t()
        logits = _rms_norm(x, self.final_norm) @ self.lm_head.t()
        return logits.argmax(dim=-1), logits


class DecodeRunner:
    """The model plus static input buffers sized for the largest batch, as a serving engine keeps them."""

    def __init__(self, cfg: DecoderConfig, compiled: bool = False):
        self.cfg = cfg
        self.model = Decoder(cfg)
        self.tokens = torch.zeros(cfg.max_batch, dtype=torch.long, device="cuda")
        self.positions = torch.zeros(cfg.max_batch, dtype=torch.long, device="cuda")
        self._step = torch.compile(self.model.step, dynamic=False) if compiled else self.model.step

    def run(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._step(self.tokens[:batch], self.positions[:batch])

    def reset(self, seed: int) -> None:
        """Initial KV cache and fresh random inputs: the same state in any process."""
        self.model.reset_cache()
        self.fill_inputs(seed)

    def fill_inputs(self, seed: int) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.tokens.copy_(torch.randint(0, self.cfg.vocab, (self.cfg.max_batch,), generator=gen, device="cuda"))
        self.positions.copy_(torch.randint(0, self.cfg.context, (self.cfg.max_batch,), generator=gen, device="cuda"))
