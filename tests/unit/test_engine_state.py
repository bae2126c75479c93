"""foundry_core.engine.state: engine_state.json round trip and strict reading."""

from __future__ import annotations

import json

import pytest

from test_engine_support import default_state

from foundry_core.engine.state import STATE_NAME, EngineState, read_state, write_state
from foundry_core.errors import ArchiveIOError, FormatError, InvalidArgumentError


def test_round_trip(tmp_path):
    state = default_state(adapter={"block_size": 16, "nested": {"a": [1, 2]}})
    path = write_state(tmp_path, state)
    assert path == tmp_path / STATE_NAME
    back = read_state(tmp_path)
    assert back == state
    assert back.kv_cache_bytes == 8 << 30 and back.capture_sizes == (1, 2, 4, 8)
    assert back.adapter["nested"] == {"a": [1, 2]}


def test_file_is_readable_json_and_written_atomically(tmp_path):
    write_state(tmp_path, default_state())
    write_state(tmp_path, default_state(kv_cache_blocks=1))
    assert [p.name for p in tmp_path.iterdir()] == [STATE_NAME]
    doc = json.loads((tmp_path / STATE_NAME).read_text())
    assert doc["format"] == "foundry-engine-state" and doc["kv_cache_blocks"] == 1


def test_missing_file(tmp_path):
    with pytest.raises(ArchiveIOError, match="no engine_state.json"):
        read_state(tmp_path)


def _doc() -> dict:
    return default_state().to_json()


def _set(key, value):
    def mutate(doc):
        doc[key] = value
    return mutate


def _drop(key):
    def mutate(doc):
        del doc[key]
    return mutate


CORRUPTIONS = {
    "kv bytes missing": (_drop("kv_cache_bytes"), "missing 'kv_cache_bytes'"),
    "blocks missing": (_drop("kv_cache_blocks"), "missing 'kv_cache_blocks'"),
    "boundary missing": (_drop("scratch_boundary"), "missing 'scratch_boundary'"),
    "kv bytes a string": (_set("kv_cache_bytes", "8GiB"), "'kv_cache_bytes' must be a non-negative integer"),
    "kv bytes a bool": (_set("kv_cache_bytes", True), "'kv_cache_bytes'"),
    "kv bytes a float": (_set("kv_cache_bytes", 1.5), "'kv_cache_bytes'"),
    "negative blocks": (_set("kv_cache_blocks", -1), "'kv_cache_blocks'"),
    "high water beyond region": (_set("region_high_water", 1 << 50), "'region_high_water'"),
    "boundary beyond region": (_set("scratch_boundary", 1 << 50), "'scratch_boundary'"),
    "capture sizes not a list": (_set("capture_sizes", "1,2"), "'capture_sizes'"),
    "zero capture size": (_set("capture_sizes", [1, 0]), "'capture_sizes'"),
    "adapter not an object": (_set("adapter", [1]), "'adapter'"),
    "unknown field": (_set("kv_cache_dtype", "fp8"), "unknown field 'kv_cache_dtype'"),
    "other format": (_set("format", "foundry-archive"), "'format'"),
    "newer version": (_set("version", 2), "'version'"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_state_names_the_field(tmp_path, name):
    mutate, expected = CORRUPTIONS[name]
    doc = _doc()
    mutate(doc)
    (tmp_path / STATE_NAME).write_text(json.dumps(doc))
    with pytest.raises(FormatError) as info:
        read_state(tmp_path)
    assert expected in str(info.value)
    assert STATE_NAME in str(info.value)


@pytest.mark.parametrize("text,expected", [("", "not valid JSON"), ('{"kv', "not valid JSON"),
                                           ("[]", "not a JSON object"), ("\xff", "not valid JSON")])
def test_unparseable_state(tmp_path, text, expected):
    (tmp_path / STATE_NAME).write_text(text, encoding="latin-1")
    with pytest.raises(FormatError, match=expected):
        read_state(tmp_path)


def test_truncated_state_is_refused(tmp_path):
    write_state(tmp_path, default_state())
    data = (tmp_path / STATE_NAME).read_bytes()
    (tmp_path / STATE_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError):
        read_state(tmp_path)


def test_oversized_state_is_refused(tmp_path):
    (tmp_path / STATE_NAME).write_text(" " * (17 << 20))
    with pytest.raises(FormatError, match="larger than"):
        read_state(tmp_path)


@pytest.mark.parametrize("kwargs,expected", [
    (dict(kv_cache_bytes=-1), "kv_cache_bytes"),
    (dict(adapter={"x": object()}), "not JSON-serialisable"),
    (dict(adapter={"x": float("inf")}), "not JSON-serialisable"),
    (dict(capture_sizes=(1, -2)), "capture_sizes"),
])
def test_engine_state_validates_on_construction(kwargs, expected):
    with pytest.raises(InvalidArgumentError, match=expected):
        default_state(**kwargs)


def test_engine_state_is_immutable():
    state = default_state()
    with pytest.raises(AttributeError):
        state.kv_cache_bytes = 1  # type: ignore[misc]
    assert isinstance(state, EngineState)
