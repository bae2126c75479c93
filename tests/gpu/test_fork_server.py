"""sglang-foundry's fork server on a real GPU (a synthetic sglang package stands for SGLang): a
child forked from a process that imported torch and mapped the CUDA driver runs CUDA work, and the
safety probe tells a driver that is only mapped from one that was initialised."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_the_probe_tells_a_mapped_driver_from_an_initialised_one(program):
    r = program("fork_probe", "probe")
    assert r["mapped"] is None, r["mapped"]
    assert r["initialised"] is not None and "initialised" in r["initialised"], r


def test_a_child_forked_from_the_fork_server_uses_cuda_under_the_preload(program, tmp_path, report):
    r = program("fork_probe", "fork", str(tmp_path))
    assert r["status"]["safe"] is True, r["status"]
    assert r["exitcode"] == 0, r
    assert r["imported_in"] != r["pid"] and r["ppid"] != r["main"]  # forked from the fork server
    assert r["sum"] == 1023 * 1024 / 2
    assert r["import_capability"] == r["capability"]  # answered from NVML at import, as CUDA answers it
    assert "libfoundry.so" in r["preload"] and r["preload"] == r["main_preload"]
    report(f"forked child on {r['device']}; the fork server imported in {r['status']['import_s']:.2f} s")
