"""recipe/vllm/tiny_moe_model.py: the mixture-of-experts model folder of the tensor/expert-parallel runs."""

import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "recipe" / "vllm" / "tiny_moe_model.py"
_spec = importlib.util.spec_from_file_location("vllm_recipe_tiny_moe", _PATH)
tiny_moe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny_moe)


def test_writes_a_qwen2_moe_config_beside_the_tiny_models_tokenizer(tmp_path, monkeypatch):
    src = tmp_path / "tiny"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    for name in tiny_moe.COPIED:
        (src / name).write_text(f"{name} of the tiny model")
    monkeypatch.setattr("sys.argv", ["tiny_moe_model.py", str(tmp_path / "moe"), str(src)])
    tiny_moe.main()
    config = json.loads((tmp_path / "moe" / "config.json").read_text())
    # vLLM 0.25 runs this architecture on its V2 model runner without VLLM_USE_V2_MODEL_RUNNER.
    assert config["architectures"] == ["Qwen2MoeForCausalLM"] and config["vocab_size"] == 32000
    for name in tiny_moe.COPIED:
        assert (tmp_path / "moe" / name).read_text() == f"{name} of the tiny model"
    # Two ranks split the heads, the experts (expert parallel) and each expert (tensor parallel).
    for key in ("num_attention_heads", "num_key_value_heads", "num_experts", "moe_intermediate_size",
                "shared_expert_intermediate_size"):
        assert config[key] % 2 == 0, key
    assert config["num_experts_per_tok"] < config["num_experts"]


def test_a_folder_without_the_tiny_models_files_is_refused_naming_them(tmp_path, monkeypatch):
    import pytest

    (tmp_path / "tiny").mkdir()
    monkeypatch.setattr("sys.argv", ["tiny_moe_model.py", str(tmp_path / "moe"), str(tmp_path / "tiny")])
    with pytest.raises(SystemExit, match="lacks config.json, tokenizer.json.*tiny_model.py"):
        tiny_moe.main()
    assert not (tmp_path / "moe").exists()
