"""recipe/random_weights.py: the checkpoint it writes for the recipes' tiny models, read back here."""

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("recipe_random_weights", ROOT / "recipe" / "random_weights.py")
random_weights = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(random_weights)

# The recipes' tiny Qwen3 (the enginepack's tiny_model.py), at a quarter of its width to stay quick.
QWEN3 = {"model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768, "vocab_size": 1000,
         "initializer_range": 0.02, "tie_word_embeddings": False, "attention_bias": False}


def read_safetensors(path: Path) -> dict:
    """bfloat16 tensors as float32 arrays, parsed from the file's own layout."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    base, out, end = 8 + size, {}, 0
    for name, info in header.items():
        assert info["dtype"] == "BF16"
        start, stop = info["data_offsets"]
        assert start == end  # back to back, in order
        end = stop
        bits = np.frombuffer(raw[base + start:base + stop], np.uint16).astype(np.uint32) << 16
        out[name] = bits.view(np.float32).reshape(info["shape"])
    assert base + end == len(raw) and base % 8 == 0
    return out


def test_qwen3_names_shapes_and_count():
    shapes = random_weights.weight_shapes(QWEN3)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (4 * 64, 256)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 64, 256)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (64,)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (256, 768)
    per_layer = 2 * 256 + (256 + 128 + 128) * 256 + 256 * 256 + 2 * 64 + 3 * 768 * 256
    assert random_weights.parameter_count(shapes) == 2 * 1000 * 256 + 256 + 2 * per_layer
    tied = random_weights.weight_shapes({**QWEN3, "tie_word_embeddings": True})
    assert "lm_head.weight" not in tied and "lm_head.weight" in shapes


def test_llama_has_no_qk_norm_and_qwen2_moe_has_experts_and_biases():
    llama = random_weights.weight_shapes({**QWEN3, "model_type": "llama"})
    assert not any("q_norm" in n for n in llama)
    moe = random_weights.weight_shapes({**QWEN3, "model_type": "qwen2_moe", "num_experts": 4, "moe_intermediate_size": 32,
                                        "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1,
                                        "mlp_only_layers": [1]})
    assert moe["model.layers.0.mlp.experts.3.up_proj.weight"] == (32, 256)
    assert moe["model.layers.0.mlp.shared_expert_gate.weight"] == (1, 256)
    assert moe["model.layers.0.self_attn.q_proj.bias"] == (256,)
    assert "model.layers.1.mlp.gate_proj.weight" in moe  # a dense layer (mlp_only_layers)
    assert not any(n.startswith("model.layers.1.mlp.experts") for n in moe)


def test_written_weights_are_normal_scale_matrices_and_unit_norms(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3))
    assert random_weights.main([str(tmp_path), "--seed", "3"]) == 0
    tensors = read_safetensors(tmp_path / "model.safetensors")
    assert set(tensors) == set(random_weights.weight_shapes(QWEN3))
    if importlib.util.find_spec("safetensors"):  # the format's own parser agrees
        from safetensors import safe_open

        with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
            assert set(f.keys()) == set(tensors)
    assert np.all(tensors["model.norm.weight"] == 1.0)
    matrix = tensors["model.layers.1.mlp.gate_proj.weight"]
    assert abs(float(matrix.std()) - 0.02) < 0.001 and abs(float(matrix.mean())) < 0.001
    assert not np.array_equal(tensors["model.embed_tokens.weight"], tensors["lm_head.weight"])
    again = tmp_path / "again"
    again.mkdir()
    (again / "config.json").write_text(json.dumps(QWEN3))
    random_weights.main([str(again), "--seed", "3"])
    assert (again / "model.safetensors").read_bytes() == (tmp_path / "model.safetensors").read_bytes()
    assert not (tmp_path / "model.tmp").exists()


def test_bfloat16_rounds_to_nearest_even():
    halfway = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8], np.float32)  # between two bfloat16 values
    assert list(random_weights.to_bfloat16(halfway)) == [0x3F80, 0x3F82]  # to the even one: 1.0, 1.015625
    above = np.array([1.0 + 2.0 ** -8 + 2.0 ** -20, -2.0], np.float32)
    assert list(random_weights.to_bfloat16(above)) == [0x3F81, 0xC000]


@pytest.mark.parametrize("config, status, message", [
    ({**QWEN3, "model_type": "gpt2"}, 2, "not model_type 'gpt2'"),
    ({**QWEN3, "model_type": "llama", "attention_bias": True}, 2, "without attention_bias"),
    ({**QWEN3, "hidden_size": 4096, "num_hidden_layers": 36, "vocab_size": 151936, "intermediate_size": 12288,
      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}, 3, "is over --max-params"),
])
def test_refused_configs_write_nothing_and_say_why(tmp_path, config, status, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = subprocess.run([sys.executable, str(ROOT / "recipe" / "random_weights.py"), str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == status and message in done.stderr
    assert not (tmp_path / "model.safetensors").exists()


def _ensure_tiny_model(model: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", 'source recipe/lib.sh; ensure_tiny_model "$1"; echo "format $(load_format "$1")"',
                           "ensure", str(model)], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, **env})


def test_recipe_writes_weights_unless_told_not_to_or_the_model_is_too_large(tmp_path):
    small, large, dummy = tmp_path / "small", tmp_path / "large", tmp_path / "dummy"
    for folder, config in ((small, QWEN3), (large, {**QWEN3, "hidden_size": 4096, "num_hidden_layers": 36,
                                                     "vocab_size": 151936, "intermediate_size": 12288,
                                                     "num_attention_heads": 32, "head_dim": 128}), (dummy, QWEN3)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    done = _ensure_tiny_model(small)
    assert done.returncode == 0 and done.stdout.strip().endswith("format auto")
    done = _ensure_tiny_model(large)
    assert done.returncode == 0 and "too large for random ones" in done.stdout and done.stdout.strip().endswith("format dummy")
    done = _ensure_tiny_model(dummy, WEIGHTS="dummy")
    assert done.returncode == 0 and done.stdout.strip() == "format dummy"
    (dummy / "config.json").write_text(json.dumps({**QWEN3, "model_type": "gpt2"}))
    done = _ensure_tiny_model(dummy)
    assert done.returncode == 2 and "format" not in done.stdout  # the recipe stops
