"""The deterministic region on a real GPU, each case in fresh processes under the preload."""

from __future__ import annotations

import json

import pytest

from foundry_core.region import compare_logs

pytestmark = pytest.mark.gpu

BASE = 0x6000_0000_0000
SIZE = 256 << 30


def test_tensors_land_in_region_at_increasing_addresses(program):
    r = program("region_probe", "sequence")
    assert r["preload"], "the program did not run with the preload"
    addrs = r["addresses"]
    assert all(BASE <= a < BASE + SIZE for a in addrs), [hex(a) for a in addrs]
    assert len(set(addrs)) == len(addrs)
    # The region hands out increasing addresses; the caching allocator may place a later tensor
    # in an earlier segment, so order is checked on the allocations themselves.
    allocs = [e for e in r["log"] if e["kind"] == "alloc"]
    offsets = [e["offset"] for e in allocs]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), offsets
    assert all(any(e["offset"] <= a - BASE < e["offset"] + e["size"] for e in allocs) for a in addrs)
    assert [e["seq"] for e in r["log"]] == list(range(len(r["log"])))
    # The runtime's cuGetProcAddress lookups were answered with handlers, and allocations were seen.
    assert r["counters"][0] > 0 and r["counters"][2] > 0


def test_two_fresh_processes_get_identical_addresses_and_logs(program):
    a = program("region_probe", "sequence")
    b = program("region_probe", "sequence")
    assert a["addresses"] == b["addresses"]
    strip = [{k: e[k] for k in ("seq", "kind", "offset", "size")} for e in a["log"]]
    assert strip == [{k: e[k] for k in ("seq", "kind", "offset", "size")} for e in b["log"]]


def test_diverging_sequence_is_reported_at_the_right_sequence_number(program, tmp_path):
    saved = program("region_probe", "sequence", "1,3,8,40,2,100")
    log_path = tmp_path / "log.json"
    log_path.write_text(json.dumps(saved["log"]))
    # The fourth tensor differs in size: its allocation is the first divergent event.
    allocs = [e for e in saved["log"] if e["kind"] == "alloc"]
    addresses = saved["addresses"]
    fourth = next(e for e in allocs if e["offset"] == addresses[3] - BASE)
    r = program("region_probe", "expect", str(log_path), "1,3,8,44,2,100")
    assert r["diverged"], r
    assert r["seq"] == fourth["seq"], r
    assert "diverged at seq" in r["message"]


def test_preallocated_allocations_make_no_driver_calls(program):
    r = program("region_probe", "prealloc")
    assert r["driver_calls_during_allocs"] == 0
    assert r["inside"] and r["values_ok"]


def test_stop_sends_allocations_to_the_normal_path(program):
    r = program("region_probe", "stop")
    assert r == {"before_stop_inside": True, "while_stopped_inside": False, "after_resume_inside": True}


def test_compare_logs_offline(program):
    a = program("region_probe", "sequence", "1,3,8")
    from foundry_core.region import LogEntry

    def entries(items):
        return [LogEntry(i["seq"], i["kind"], i["offset"], i["size"]) for i in items]

    assert compare_logs(entries(a["log"]), entries(a["log"])) is None
