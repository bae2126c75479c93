"""Environment drift and allocation divergence: a LOAD on a machine or in a process that differs
from SAVE is refused naming the cause, before any restored graph replays."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu

# Fingerprint fields compared at LOAD, and two edits that simulate another machine or stack: the
# first that differs from what this machine saved is used (the suite runs on H100s and H200s).
DRIFT = {
    "driver_version": (12040, 13000),
    "cuda_runtime": ("12.4", "13.1"),
    "torch_version": ("2.9.1+cu124", "2.10.0+cu128"),
    "gpu_name": ("NVIDIA H100 80GB HBM3", "NVIDIA H200"),
    "compute_capability": ("10.0", "9.0"),
    "foundry_version": ("0.0.1", "0.0.2"),
}


def drifted(field: str, saved: object) -> object:
    return next(value for value in DRIFT[field] if value != saved)


@pytest.fixture(scope="module")
def saved_archive(tmp_path_factory):
    from conftest import run_program

    directory = tmp_path_factory.mktemp("drift")
    assert run_program("drift_probe", "save", str(directory))["saved"]
    return directory


def test_matching_load_restores_identically(program, saved_archive):
    r = program("drift_probe", "load", str(saved_archive))
    assert r["restored"] and r["identical"], r


@pytest.mark.parametrize("field", sorted(DRIFT))
def test_fingerprint_drift_is_refused_naming_the_field(program, saved_archive, tmp_path, field):
    import shutil

    archive = tmp_path / "archive"
    shutil.copytree(saved_archive, archive)
    manifest = archive / "graph.json"  # the single-graph flow names its manifest
    doc = json.loads(manifest.read_text())
    assert field in doc["fingerprint"], sorted(doc["fingerprint"])
    doc["fingerprint"][field] = drifted(field, doc["fingerprint"][field])
    manifest.write_text(json.dumps(doc))
    r = program("drift_probe", "load", str(archive))
    assert not r["restored"] and not r["replayed"], r
    assert r["error"] == "MismatchError" and repr(field) in r["message"], r


def test_allocation_divergence_is_refused_before_any_replay(program, saved_archive):
    env = dict(os.environ, FOUNDRY_STRICT="1")
    r = program("drift_probe", "load", str(saved_archive), str(3 << 20), env=env)
    assert not r["restored"] and not r["replayed"], r
    assert r["error"] == "DivergenceError", r
    assert "not where SAVE put them" in r["message"], r
