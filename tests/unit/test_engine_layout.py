"""foundry_core.engine.layout: per-rank paths, engine.json, refusal of another topology."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foundry_core.engine.layout import (
    ENGINE_INFO_NAME,
    Topology,
    atomic_write_json,
    check_topology,
    rank_dir,
    read_topology,
    write_topology,
)
from foundry_core.errors import ArchiveIOError, FormatError, InvalidArgumentError, MismatchError

TOPO = Topology("vllm", "0.33.0", world_size=4, tp=2, pp=1, dp=2, ep=4)


def test_rank_dir_is_per_global_rank(tmp_path):
    assert rank_dir(tmp_path, 0) == tmp_path / "rank0"
    assert rank_dir(str(tmp_path), 13) == tmp_path / "rank13"


@pytest.mark.parametrize("rank", [-1, 1.0, "0", True, None])
def test_rank_dir_refuses_bad_ranks(tmp_path, rank):
    with pytest.raises(InvalidArgumentError):
        rank_dir(tmp_path, rank)


def test_topology_round_trip(tmp_path):
    assert write_topology(tmp_path, TOPO) is True
    assert read_topology(tmp_path) == TOPO
    doc = json.loads((tmp_path / ENGINE_INFO_NAME).read_text())
    assert doc["engine"] == "vllm" and doc["tp"] == 2 and doc["format"] == "foundry-engine"


def test_topology_written_once(tmp_path):
    assert write_topology(tmp_path, TOPO) is True
    mtime = (tmp_path / ENGINE_INFO_NAME).stat().st_mtime_ns
    assert write_topology(tmp_path, TOPO) is False
    assert (tmp_path / ENGINE_INFO_NAME).stat().st_mtime_ns == mtime


def test_a_new_save_replaces_another_topology(tmp_path):
    write_topology(tmp_path, TOPO)
    other = Topology("vllm", "0.33.0", world_size=1)
    assert write_topology(tmp_path, other) is True
    assert read_topology(tmp_path) == other


def test_writes_leave_no_temporary_files(tmp_path):
    write_topology(tmp_path / "new", TOPO)
    atomic_write_json(tmp_path / "new" / "x.json", {"a": 1})
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [ENGINE_INFO_NAME, "x.json"]


def test_matching_topology_is_accepted(tmp_path):
    write_topology(tmp_path, TOPO)
    assert check_topology(tmp_path, Topology("vllm", "0.33.0", 4, 2, 1, 2, 4)) == TOPO


@pytest.mark.parametrize("change,field", [
    (dict(world_size=2, dp=1), "world_size"),
    (dict(tp=4, dp=1), "tp"),
    (dict(ep=1), "ep"),
    (dict(engine_version="0.34.0"), "engine_version"),
    (dict(engine="sglang"), "engine"),
])
def test_other_topology_is_refused_naming_both(tmp_path, change, field):
    write_topology(tmp_path, TOPO)
    current = Topology(**{**TOPO.__dict__, **change})
    with pytest.raises(MismatchError) as info:
        check_topology(tmp_path, current)
    message = str(info.value)
    assert TOPO.describe() in message and current.describe() in message
    assert f"{field} {getattr(TOPO, field)!r} vs {getattr(current, field)!r}" in message


def test_missing_engine_json(tmp_path):
    with pytest.raises(ArchiveIOError, match="no engine.json"):
        read_topology(tmp_path)


@pytest.mark.parametrize("content,expected", [
    ("{", "not valid JSON"),
    ("[]", "not a JSON object"),
    ('{"format": "x", "version": 1}', "'format'"),
    ('{"format": "foundry-engine", "version": 2}', "'version'"),
    ('{"format": "foundry-engine", "version": 1, "engine": "e", "engine_version": "1", "world_size": 1, '
     '"tp": 1, "pp": 1, "dp": 1}', "missing 'ep'"),
    ('{"format": "foundry-engine", "version": 1, "engine": "e", "engine_version": "1", "world_size": 1, '
     '"tp": 1, "pp": 1, "dp": 1, "ep": 1, "cp": 2}', "unknown field 'cp'"),
    ('{"format": "foundry-engine", "version": 1, "engine": "e", "engine_version": "1", "world_size": 0, '
     '"tp": 1, "pp": 1, "dp": 1, "ep": 1}', "world_size"),
])
def test_corrupt_engine_json_names_the_problem(tmp_path, content, expected):
    (tmp_path / ENGINE_INFO_NAME).write_text(content)
    with pytest.raises(FormatError) as info:
        read_topology(tmp_path)
    assert expected in str(info.value)


def test_symlinked_engine_json_is_refused(tmp_path):
    real = tmp_path / "elsewhere.json"
    write_topology(tmp_path / "a", TOPO)
    real.write_text((tmp_path / "a" / ENGINE_INFO_NAME).read_text())
    (tmp_path / ENGINE_INFO_NAME).symlink_to(real)
    with pytest.raises(FormatError, match="symbolic link"):
        read_topology(tmp_path)


@pytest.mark.parametrize("kwargs", [dict(world_size=0), dict(tp=-1), dict(engine=""), dict(pp=True)])
def test_topology_validates_its_fields(kwargs):
    base = dict(engine="e", engine_version="1", world_size=1)
    with pytest.raises(InvalidArgumentError):
        Topology(**{**base, **kwargs})


def test_rank_dirs_of_a_world_are_distinct(tmp_path):
    dirs = {rank_dir(tmp_path, r) for r in range(TOPO.world_size)}
    assert len(dirs) == TOPO.world_size and all(isinstance(d, Path) for d in dirs)
