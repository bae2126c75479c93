"""foundry_core.engine.fingerprint: stable assembly, sensitivity to every input, mismatch reports."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundry_core.engine.fingerprint import (
    FIELDS_KEY,
    ParallelConfig,
    canonical_json,
    config_hash,
    describe_mismatch,
    engine_fields,
    engine_fingerprint,
    explain_mismatch,
)
from foundry_core.errors import InvalidArgumentError, MismatchError
from foundry_core.fingerprint import check_fingerprint

MODEL = {"architecture": "Qwen3", "hidden_size": 4096, "layers": 36, "rope": {"theta": 1e6, "scaling": None}}
KNOBS = {"cudagraph_mode": "FULL_DECODE_ONLY", "attention": {"backend": "flashinfer", "split_kv": True}}


def fp(**changes):
    args = dict(engine="vllm", engine_version="0.33.0", model=MODEL, capture_sizes=[1, 2, 4, 8],
                parallel={"tp": 2, "dp": 2, "ep": 4}, rank=1, dtype="bfloat16", knobs=KNOBS)
    args.update(changes)
    return engine_fingerprint(**args)


def test_same_inputs_same_fingerprint():
    assert fp() == fp()
    assert list(fp()) == list(fp())


def test_flat_json_scalars_and_lists():
    f = fp()
    assert all(k.startswith("engine.") for k in f)
    assert all(isinstance(v, (str, int, float, bool, type(None), list)) for v in f.values())
    assert f["engine.world_size"] == 4 and f["engine.tp"] == 2 and f["engine.pp"] == 1 and f["engine.rank"] == 1
    assert f["engine.knob.cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert f["engine.knob.attention"] == '{"backend":"flashinfer","split_kv":true}'
    assert f[FIELDS_KEY] == sorted(k for k in f if k != FIELDS_KEY)


def test_dict_order_is_irrelevant():
    shuffled_model = dict(reversed(list(MODEL.items())))
    shuffled_model["rope"] = {"scaling": None, "theta": 1e6}
    shuffled_knobs = {"attention": {"split_kv": True, "backend": "flashinfer"}, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert fp(model=shuffled_model, knobs=shuffled_knobs) == fp()
    assert fp(parallel={"ep": 4, "dp": 2, "tp": 2}) == fp()


def test_model_hash_is_sha256_of_canonical_json():
    expected = hashlib.sha256(b'{"a":1,"b":[1,2,{"c":null}]}').hexdigest()
    assert config_hash({"b": (1, 2, {"c": None}), "a": 1}) == expected
    assert fp()["engine.model_hash"] == config_hash(MODEL)


@pytest.mark.parametrize("change", [
    dict(engine="sglang"), dict(engine_version="0.34.0"), dict(model={**MODEL, "layers": 37}),
    dict(capture_sizes=[1, 2, 4]), dict(capture_sizes=[8, 4, 2, 1]), dict(parallel={"tp": 4, "ep": 4}),
    dict(parallel={"tp": 2, "dp": 2, "ep": 2}), dict(parallel={"tp": 2, "pp": 2, "ep": 4}), dict(rank=0),
    dict(dtype="float16"), dict(dtype=None),
])
def test_any_input_change_changes_the_fingerprint(change):
    assert fp(**change) != fp()


@pytest.mark.parametrize("knobs", [
    {**KNOBS, "cudagraph_mode": "PIECEWISE"},
    {**KNOBS, "attention": {"backend": "flashinfer", "split_kv": False}},
    {**KNOBS, "new_knob": 0},
    {"cudagraph_mode": "FULL_DECODE_ONLY"},
    {**KNOBS, "cudagraph_mode": 1},
    None,
])
def test_any_knob_change_changes_the_fingerprint(knobs):
    assert fp(knobs=knobs) != fp()


def test_torch_dtype_spelling_is_normalised():
    class FakeDtype:
        def __str__(self):
            return "torch.bfloat16"

    assert fp(dtype=FakeDtype())["engine.dtype"] == "bfloat16"


def test_world_size_defaults_to_tp_pp_dp():
    assert ParallelConfig(tp=2, pp=3, dp=2).world_size == 12
    assert ParallelConfig(tp=2, world_size=16).world_size == 16
    assert ParallelConfig.from_value({"tp": 8}).world_size == 8


@pytest.mark.parametrize("bad", [{"tp": 0}, {"tp": 2, "cp": 2}, {"world_size": -1}, [2, 1], {"dp": True}])
def test_bad_parallel_config(bad):
    with pytest.raises(InvalidArgumentError):
        ParallelConfig.from_value(bad)


@pytest.mark.parametrize("change,expected", [
    (dict(model={"a": object()}), "model identity.a"),
    (dict(model={"a": {"b": [1, {2}]}}), "model identity.a.b[1]"),
    (dict(model={"a": float("nan")}), "model identity.a"),
    (dict(model={1: "a"}), "key 1"),
    (dict(model=[1, 2]), "must be a dict"),
    (dict(knobs={"k": object()}), "graph knob 'k'"),
    (dict(capture_sizes=[1, 0]), "capture sizes"),
    (dict(capture_sizes="1,2"), "capture sizes"),
    (dict(rank=4), "outside the world of 4"),
    (dict(engine=""), "engine"),
])
def test_unusable_inputs_are_named(change, expected):
    with pytest.raises(InvalidArgumentError) as info:
        fp(**change)
    assert expected in str(info.value)


def test_explain_mismatch_field_by_field():
    saved = fp()
    current = fp(parallel={"tp": 1, "dp": 4, "ep": 4}, knobs={**KNOBS, "cudagraph_mode": "PIECEWISE"})
    lines = explain_mismatch(saved, current)
    assert "engine.tp: saved 2, now 1" in lines
    assert "engine.dp: saved 2, now 4" in lines
    assert "engine.knob.cudagraph_mode: saved 'FULL_DECODE_ONLY', now 'PIECEWISE'" in lines
    assert len(lines) == 3
    assert describe_mismatch(saved, current) == "; ".join(lines)


def test_explain_added_and_removed_knobs():
    lines = explain_mismatch(fp(knobs={"a": 1}), fp(knobs={"b": 1}))
    assert lines == ["engine.knob.a: saved 1, now absent", "engine.knob.b: saved absent, now 1"]


def test_explain_agreeing_fingerprints():
    assert explain_mismatch(fp(), fp()) == []
    assert describe_mismatch(fp(), fp()) is None


def test_explain_distinguishes_types():
    assert explain_mismatch({"x": 1}, {"x": True}) == ["x: saved 1, now True"]


def test_explain_names_the_entries_inside_a_structured_knob():
    """A knob stored as JSON (SGLang's whole graph configuration) names the entries that differ,
    which its cut-off JSON text would hide."""
    config = {"decode": {"backend": "full", "bs": [1, 2, 4, 8] * 8}, "prefill": {"backend": "breakable", "max": 8192}}
    changed = {**config, "prefill": {"backend": "disabled", "max": 8192}}
    lines = explain_mismatch(fp(knobs={"cfg": config}), fp(knobs={"cfg": changed}))
    assert lines == ["engine.knob.cfg differs at prefill.backend: saved 'breakable', now 'disabled'"]
    listed = {**config, "decode": {"backend": "full", "bs": [1, 2, 4, 16] * 8}}
    lines = explain_mismatch(fp(knobs={"cfg": config}), fp(knobs={"cfg": listed}))
    assert lines == ["engine.knob.cfg differs at decode.bs[3]: saved 8, now 16, decode.bs[7]: saved 8, now 16, "
                     "decode.bs[11]: saved 8, now 16 and 5 more"]


def test_explain_structured_knob_added_entry_and_other_shapes():
    lines = explain_mismatch(fp(knobs={"cfg": {"a": 1}}), fp(knobs={"cfg": {"a": 1, "b": [1]}}))
    assert lines == ["engine.knob.cfg differs at b: saved absent, now [1]"]
    # Lists of another length, or a knob that changed kind, are shown whole.
    assert explain_mismatch({"k": "[1,2]"}, {"k": "[1]"}) == ["k: saved '[1,2]', now '[1]'"]
    assert explain_mismatch({"k": '{"a":1}'}, {"k": 3}) == ["k: saved '{\"a\":1}', now 3"]
    assert explain_mismatch({"k": "{not json"}, {"k": "{x"}) == ["k: saved '{not json', now '{x'"]


def test_engine_fields_pick_the_engine_part():
    full = {"gpu_name": "H200", "driver_version": 13000, **fp()}
    assert engine_fields(full) == fp()


def test_load_time_check_names_a_changed_knob():
    """The fields go through foundry_core.fingerprint.check_fingerprint at LOAD: a changed,
    removed or added knob is refused there too."""
    env = {"gpu_name": "H200", "compute_capability": "9.0", "driver_version": 13000, "cuda_runtime": "13.0",
           "torch_version": "2.11.0", "foundry_version": "0.1.0"}
    saved = {**env, **fp()}
    with pytest.raises(MismatchError, match="engine.knob.cudagraph_mode"):
        check_fingerprint(saved, {**env, **fp(knobs={**KNOBS, "cudagraph_mode": "NONE"})})
    with pytest.raises(MismatchError, match="engine.knob.attention"):
        check_fingerprint(saved, {**env, **fp(knobs={"cudagraph_mode": "FULL_DECODE_ONLY"})})
    with pytest.raises(MismatchError, match="engine.fields"):
        check_fingerprint(saved, {**env, **fp(knobs={**KNOBS, "extra": 1})})
    check_fingerprint(saved, {**env, **fp()})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=8), st.randoms())
def test_config_hash_ignores_key_order(config, rnd: random.Random):
    items = list(config.items())
    rnd.shuffle(items)
    assert config_hash(dict(items)) == config_hash(config)
    assert canonical_json(dict(items)) == canonical_json(config)


def test_scalar_subclasses_become_plain_values():
    # An adapter handing over an IntEnum (vLLM's CompilationMode) or a str-mixin enum must get the
    # same field a JSON round trip gives back, or LOAD calls its own archive stale.
    import enum

    class Level(enum.IntEnum):
        THREE = 3

    class Name(str, enum.Enum):
        AUTO = "auto"

    fp = engine_fingerprint("eng", "1.0", {"m": 1}, [1], ParallelConfig(), 0,
                            knobs={"level": Level.THREE, "name": Name.AUTO})
    assert type(fp["engine.knob.level"]) is int and fp["engine.knob.level"] == 3
    assert type(fp["engine.knob.name"]) is str and fp["engine.knob.name"] == "auto"
    assert describe_mismatch(json.loads(json.dumps(fp)), fp) is None
