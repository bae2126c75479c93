"""`foundry inspect`, `verify` and `diff` on synthetic archives (no GPU needed).

Archives are built from parts: a payload written from JSON by foundry_payload_from_json, image
files written by foundry_image_file_write_synthetic, and a manifest with a hand-written
fingerprint. Each corruption test breaks one thing and checks that verify names it.
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from archive_factory import write_image, write_payload
from foundry_core import _native, cli
from foundry_core.engine.host_caches import HostCaches
from foundry_core.errors import FormatError
from foundry_core.inspect import image_file_info, payload_dump, summarize
from foundry_core.manifest import write_manifest
from foundry_core.verify import FAIL, OK, SKIPPED, verify_archive

from archive_factory import CUBIN, FINGERPRINT, GEMM, IMAGE_A, IMAGE_B, INIT, KERNEL, PTX, REGION_BASE, REGION_SIZE

IMAGE_C = 0x00000000000000CC
# IMAGE_A is above 2^53: it must stay exact through JSON.


# ---- building synthetic archives ------------------------------------------------------------


def kernel(image: int, name: str, grid: int = 1, params: str = "0000006000000000", cache_config: int = 0) -> dict:
    return {"kind": "kernel", "kernel": {
        "image": f"{image:016x}", "name": name, "grid": [grid, 1, 1], "block": [128, 1, 1], "shared_mem": 0,
        "params": params, "slots": [{"offset": 0, "size": 8}], "attrs": [],
        "func": {"max_dynamic_shared": 0, "preferred_carveout": -1, "required_cluster": [0, 0, 0],
                 "non_portable_cluster": 0, "cluster_scheduling": 0, "cache_config": cache_config}}}


def edge(a: int, b: int, kind: int = 0, from_port: int = 0) -> dict:
    return {"from": a, "to": b, "from_port": from_port, "to_port": 0, "type": kind}


def payload_doc() -> dict:
    """Two groups: a decode template shared by bs=1 and bs=2 (bs=2 changes one kernel's grid), and
    a prefill template."""
    decode = {
        "nodes": [
            kernel(IMAGE_A, INIT),
            {"kind": "memset", "memset": {"dst": REGION_BASE + 4096, "pitch": 0, "value": 0, "element_size": 4,
                                          "width": 256, "height": 1}},
            kernel(IMAGE_A, KERNEL, grid=8),
            {"kind": "event_record", "event": 0},
            kernel(IMAGE_B, GEMM),
            {"kind": "child_graph", "child": 0},
        ],
        "edges": [edge(0, 1), edge(1, 2), edge(2, 3), edge(2, 4, kind=1, from_port=1), edge(4, 5)],
        "children": [{"nodes": [{"kind": "empty"}, kernel(IMAGE_B, GEMM)], "edges": [edge(0, 1)], "children": []}],
    }
    prefill = {"nodes": [kernel(IMAGE_B, GEMM, grid=64)], "edges": [], "children": []}
    refs = [{"offset": 0, "size": 1 << 20, "kind": 1}]
    return {
        "version": 3, "region": {"base": REGION_BASE, "size": REGION_SIZE}, "event_count": 1,
        "templates": [decode, prefill],
        "members": [
            {"name": "bs=1", "template": 0, "delta": [], "refs": refs},
            {"name": "bs=2", "template": 0, "delta": [{"node": 2, "value": kernel(IMAGE_A, KERNEL, grid=16)}],
             "refs": refs},
            {"name": "prefill", "template": 1, "delta": [], "refs": refs},
        ],
    }


def output(ptr: int) -> dict:
    return {"kind": "tensor", "tensors": [{"ptr": ptr, "shape": [2, 4], "stride": [4, 1], "dtype": "float32"}]}


def manifest_doc(names: list[str]) -> dict:
    return {
        "format": "foundry-archive", "version": 1, "fingerprint": dict(FINGERPRINT), "payload": "graphs.fgr",
        "region": {"base": REGION_BASE, "size": REGION_SIZE, "high_water": 3 << 20},
        "graphs": [{"name": n, "outputs": output(REGION_BASE + 8192 * (i + 1))} for i, n in enumerate(names)],
        "log": "alloc_log.json", "created": "2025-01-01T00:00:00Z",
    }


def make_archive(path: Path, payload: dict | None = None, manifest: dict | None = None) -> Path:
    payload = payload or payload_doc()
    path.mkdir(parents=True)
    write_payload(path / "graphs.fgr", payload)
    write_image(path / "images", IMAGE_A, [KERNEL, INIT], CUBIN, loader=1)
    write_image(path / "images", IMAGE_B, [GEMM], PTX)
    (path / "alloc_log.json").write_text("[]")
    write_manifest(path / "manifest.json", manifest or manifest_doc([m["name"] for m in payload["members"]]))
    return path


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    return make_archive(tmp_path / "arch")


@pytest.fixture
def wide(monkeypatch):
    """Rich tables as wide as needed: no wrapping inside the cells the tests look for."""
    monkeypatch.setenv("COLUMNS", "250")


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def checks_by_name(path: Path) -> dict:
    return {c.name: c for c in verify_archive(path)}


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def no_gpu() -> bool:
    from conftest import gpu_unavailable_reason

    return gpu_unavailable_reason() is not None


# ---- the native readers ---------------------------------------------------------------------


def test_payload_json_round_trips_through_the_file(archive):
    doc = payload_doc()
    dumped = payload_dump(archive / "graphs.fgr")
    assert dumped == doc
    assert dumped["templates"][0]["nodes"][0]["kernel"]["image"] == f"{IMAGE_A:016x}"


def test_payload_from_json_names_the_bad_field(tmp_path):
    doc = payload_doc()
    del doc["templates"][0]["nodes"][2]["kernel"]["block"]
    with pytest.raises(FormatError, match=r"templates\[0\]\.nodes\[2\]\.kernel\.block: missing"):
        write_payload(tmp_path / "p.fgr", doc)
    doc = payload_doc()
    doc["members"][1]["delta"][0]["node"] = 1  # a kernel in place of the template's memset
    with pytest.raises(FormatError, match=r"members\[1\]\.delta"):
        write_payload(tmp_path / "p.fgr", doc)
    assert not (tmp_path / "p.fgr").exists()


# ---- kernel cache preferences (cuFuncSetCacheConfig) ----------------------------------------------


PREFER_SHARED = 1  # CU_FUNC_CACHE_PREFER_SHARED


def with_gemm_preferring_shared(doc: dict) -> dict:
    """Every GEMM node with PREFER_SHARED, as Triton sets it on kernels above 48 KiB of shared memory."""
    def mark(graph: dict) -> None:
        for n in graph["nodes"]:
            if n["kind"] == "kernel" and n["kernel"]["name"] == GEMM:
                n["kernel"]["func"]["cache_config"] = PREFER_SHARED
        for c in graph["children"]:
            mark(c)

    doc = copy.deepcopy(doc)
    for t in doc["templates"]:
        mark(t)
    return doc


def section_types(path: Path) -> list[int]:
    from archive_factory import container_table

    return [e.type for e in container_table(path)]


def test_cache_preferences_round_trip_once_per_kernel(tmp_path):
    doc = with_gemm_preferring_shared(payload_doc())
    write_payload(tmp_path / "p.fgr", doc)
    assert payload_dump(tmp_path / "p.fgr") == doc
    assert section_types(tmp_path / "p.fgr").count(5) == 1  # the kernel cache-config table
    write_payload(tmp_path / "plain.fgr", payload_doc())
    assert 5 not in section_types(tmp_path / "plain.fgr")  # no preference: the file older builds wrote


def test_version_2_payload_json_reads_as_prefer_none(tmp_path):
    doc = payload_doc()
    old = copy.deepcopy(doc)
    old["version"] = 2
    for t in old["templates"]:
        for n in [*t["nodes"], *(m for c in t["children"] for m in c["nodes"])]:
            if n["kind"] == "kernel":
                del n["kernel"]["func"]["cache_config"]
    for m in old["members"]:
        for d in m["delta"]:
            del d["value"]["kernel"]["func"]["cache_config"]
    write_payload(tmp_path / "p.fgr", old)
    assert payload_dump(tmp_path / "p.fgr") == doc


def test_one_kernel_with_two_cache_preferences_is_refused(tmp_path):
    doc = with_gemm_preferring_shared(payload_doc())
    doc["templates"][1]["nodes"][0]["kernel"]["func"]["cache_config"] = 2
    with pytest.raises(FormatError, match=r"templates\[1\]\.nodes\[0\]\.kernel\.func\.cache_config: 2, but "
                                          r"templates\[0\]\.nodes\[4\] runs the same kernel"):
        write_payload(tmp_path / "p.fgr", doc)
    doc["templates"][1]["nodes"][0]["kernel"]["func"]["cache_config"] = 7
    with pytest.raises(FormatError, match="not a CUfunc_cache value"):
        write_payload(tmp_path / "p.fgr", doc)


def test_inspect_graph_shows_a_kernels_cache_preference(tmp_path, capsys):
    archive = make_archive(tmp_path / "arch", payload=with_gemm_preferring_shared(payload_doc()))
    code, out, _ = run_cli(capsys, "inspect", str(archive), "--graph", "0")
    assert code == 0
    lines = [ln for ln in out.splitlines() if "  kernel  " in ln]
    assert [ln for ln in lines if "cache=prefer_shared" in ln] == [ln for ln in lines if GEMM in ln]
    assert len([ln for ln in lines if GEMM in ln]) == 2  # the template's and its child graph's
    code, out, _ = run_cli(capsys, "inspect", str(archive), "--graph", "0", "--json")
    detail = json.loads(out)
    assert detail["nodes"][4]["kernel"]["func"]["cache_config"] == PREFER_SHARED
    assert detail["nodes"][0]["kernel"]["func"]["cache_config"] == 0


@pytest.mark.parametrize("attr, shown", [
    ({"id": 8, "value": "ffffffff" + "00" * 60}, "priority=-1"),
    ({"id": 4, "value": "02000000" "01000000" "01000000" + "00" * 52}, "cluster=2x1x1"),
    ({"id": 10, "value": "01000000" + "00" * 60}, "mem_sync_domain=remote"),
    ({"id": 9, "value": "0001" + "00" * 62}, "mem_sync_domain_map=default:0,remote:1"),
    ({"id": 2, "value": "01000000" + "00" * 60}, "cooperative=1"),
])
def test_inspect_graph_shows_a_kernels_launch_attributes(tmp_path, capsys, attr, shown):
    doc = payload_doc()
    doc["templates"][0]["nodes"][0]["kernel"]["attrs"] = [attr]
    archive = make_archive(tmp_path / "arch", payload=doc)
    code, out, _ = run_cli(capsys, "inspect", str(archive), "--graph", "0")
    kernels = [ln for ln in out.splitlines() if "  kernel  " in ln]
    assert code == 0 and shown in kernels[0] and not any(shown in ln for ln in kernels[1:])


def test_image_file_dump(archive):
    info = image_file_info(archive / "images" / f"{IMAGE_A:016x}.fimg")
    assert info["hash"] == f"{IMAGE_A:016x}"
    assert info["kind_name"] == "cubin" and info["loader"] == "library"
    assert info["entries"] == sorted([KERNEL, INIT])
    assert info["size"] == len(CUBIN) and info["stored_size"] == len(CUBIN) and info["segments"] == [len(CUBIN)]
    ptx = image_file_info(archive / "images" / f"{IMAGE_B:016x}.fimg")
    assert ptx["kind_name"] == "ptx" and ptx["loader"] == "module"


def test_synthetic_image_must_be_named_by_its_hash(tmp_path):
    names = (ctypes.c_char_p * 1)(b"k")
    with pytest.raises(Exception, match="must be named"):
        _native.call("foundry_image_file_write_synthetic", os.fsencode(tmp_path / "x.fimg"), IMAGE_A, 0, names, 1,
                     CUBIN, len(CUBIN))


# ---- inspect ----------------------------------------------------------------------------------


def test_inspect_json_summary(archive, capsys):
    code, out, _ = run_cli(capsys, "inspect", str(archive), "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary == json.loads(json.dumps(summarize(archive)))
    (rank,) = summary["ranks"]
    assert rank["rank"] is None
    assert rank["fingerprint"] == FINGERPRINT
    assert rank["graph_count"] == 3 and rank["groups"] == 2
    assert [g["name"] for g in rank["graphs"]] == ["bs=1", "bs=2", "prefill"]
    assert [g["delta_nodes"] for g in rank["graphs"]] == [0, 1, 0]
    # Per graph: decode has 6 nodes + 2 in its child graph; prefill 1. Counted over all 3 graphs.
    assert rank["nodes_by_kind"] == {"kernel": 9, "memset": 2, "event_record": 2, "child_graph": 2, "empty": 2}
    by_image = {r["image"]: r for r in rank["kernels_by_image"]}
    assert by_image[f"{IMAGE_A:016x}"] == {"image": f"{IMAGE_A:016x}", "kernel_nodes": 4, "kind": "cubin",
                                           "size": len(CUBIN)}
    assert by_image[f"{IMAGE_B:016x}"]["kernel_nodes"] == 5 and by_image[f"{IMAGE_B:016x}"]["kind"] == "ptx"
    assert {i["hash"]: i["entries"] for i in rank["images"]} == {f"{IMAGE_A:016x}": 2, f"{IMAGE_B:016x}": 1}
    assert rank["region"] == {"base": REGION_BASE, "size": REGION_SIZE, "high_water": 3 << 20}
    assert rank["payload_size"] == (archive / "graphs.fgr").stat().st_size
    assert rank["archive_size"] > rank["payload_size"]


def test_inspect_table(archive, capsys, wide):
    code, out, _ = run_cli(capsys, "inspect", str(archive))
    assert code == 0
    for text in ("fingerprint.gpu_name", "NVIDIA H200", "groups", "region base", "0x600000000000",
                 "region high-water", "payload size", "archive size", "nodes by type", "kernels by image",
                 f"{IMAGE_A:016x}", "cubin", "ptx", "library", "bs=2", "prefill"):
        assert text in out, text


def test_inspect_graph_applies_the_delta(archive, capsys):
    code, out, _ = run_cli(capsys, "inspect", str(archive), "--graph", "1")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "graph 1 'bs=2' (group 0)"
    kernel_line = next(ln for ln in lines if ln.strip().startswith("2  kernel"))
    assert "grid=16x1x1" in kernel_line and "block=128x1x1" in kernel_line and "smem=0" in kernel_line
    if shutil.which("c++filt"):
        assert "kernel(float*, int)" in kernel_line
    else:
        assert KERNEL in kernel_line
    assert any("memset" in ln and "dst=0x600000001000" in ln and "width=256" in ln for ln in lines)
    assert "  2 -> 4  programmatic  (port programmatic -> default)" in lines
    assert "child graph 0:" in lines
    # By name, as JSON: the same graph.
    code, out, _ = run_cli(capsys, "inspect", str(archive), "--graph", "bs=2", "--json")
    detail = json.loads(out)
    assert code == 0 and detail["index"] == 1 and detail["nodes"][2]["kernel"]["grid"] == [16, 1, 1]


def _collective(count: int) -> dict:
    call = {"op": 0, "comm": 1, "send": REGION_BASE + 4096, "recv": REGION_BASE + 4096, "count": count, "dtype": 9,
            "redop": 0, "root": 0, "nranks": 2, "rank": 1}
    return {"kind": "collective", "collective": {"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel": 0,
                                                 "calls": [call]}}


def test_inspect_shows_nccl_collectives(archive, capsys, wide):
    doc = payload_doc()
    decode = doc["templates"][0]
    last = len(decode["nodes"])
    decode["nodes"].append(_collective(4096))
    decode["edges"].append(edge(last - 1, last))
    doc["members"][1]["delta"].append({"node": last, "value": _collective(8192)})
    write_payload(archive / "graphs.fgr", doc)
    (rank,) = summarize(archive)["ranks"]
    assert rank["nodes_by_kind"]["collective"] == 2
    assert rank["collectives"] == [{"op": "all_reduce", "comm": 1, "nranks": 2, "rank": 1, "calls": 2}]
    code, out, _ = run_cli(capsys, "inspect", str(archive))
    assert code == 0 and "NCCL collectives" in out and "1 of 2" in out
    code, out, _ = run_cli(capsys, "inspect", str(archive), "--graph", "bs=2")
    line = next(ln for ln in out.splitlines() if "collective" in ln)
    assert "NCCL all_reduce of 8192 (dtype 9)" in line and "comm 1 rank 1/2" in line and "AllReduce" in line


def test_inspect_unknown_graph_is_an_error(archive, capsys):
    code, _, err = run_cli(capsys, "inspect", str(archive), "--graph", "7")
    assert code == 1 and "no graph 7" in err


def test_inspect_shows_each_rank(tmp_path, capsys, wide):
    root = tmp_path / "multi"
    make_archive(root / "rank0")
    make_archive(root / "rank1")
    code, out, _ = run_cli(capsys, "inspect", str(root), "--json")
    assert code == 0
    assert [r["rank"] for r in json.loads(out)["ranks"]] == ["rank0", "rank1"]
    code, out, _ = run_cli(capsys, "inspect", str(root))
    assert "(rank0)" in out and "(rank1)" in out


# ---- verify -----------------------------------------------------------------------------------


def test_verify_passes_on_a_good_archive(archive, capsys):
    checks = checks_by_name(archive)
    expected = {"manifest", "symbolic links", "paths", "files", "payload", "images", "fingerprint",
                "kernel references", "graph references", "output references"}
    assert set(checks) == expected
    for name, c in checks.items():
        if name != "fingerprint":  # compared against this machine when it has a GPU
            assert c.status == OK, c
    if no_gpu():
        assert checks["fingerprint"].status == SKIPPED
        code, out, _ = run_cli(capsys, "verify", str(archive))
        assert code == 0, out
        assert "10 of 10 checks passed" in out


@pytest.mark.skipif(not no_gpu(), reason="this machine has a GPU: the fingerprint is compared, not skipped")
def test_verify_without_a_gpu_skips_the_fingerprint(archive):
    out = subprocess.run([sys.executable, "-m", "foundry_core.cli", "verify", str(archive)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "fingerprint" in ln)
    assert line.startswith("skipped") and "no GPU" in line and "FAIL" not in line
    assert "10 of 10 checks passed" in out.stdout


def assert_fails(path: Path, check: str, reason: str, capsys=None) -> None:
    checks = checks_by_name(path)
    assert checks[check].status == FAIL, checks[check]
    assert reason in checks[check].detail, checks[check].detail
    if capsys is not None:
        code, out, _ = run_cli(capsys, "verify", str(path))
        assert code == 1
        assert any(ln.startswith("FAIL") and check in ln for ln in out.splitlines()), out


def test_verify_truncated_payload(archive, capsys):
    p = archive / "graphs.fgr"
    p.write_bytes(p.read_bytes()[:-100])
    assert_fails(archive, "payload", "truncated", capsys)


def test_verify_flipped_byte_in_payload(archive):
    p = archive / "graphs.fgr"
    flip_byte(p, p.stat().st_size - 20)
    assert_fails(archive, "payload", "checksum mismatch")


def test_verify_flipped_byte_in_an_image(archive):
    p = archive / "images" / f"{IMAGE_B:016x}.fimg"
    flip_byte(p, p.stat().st_size - 8)
    assert_fails(archive, "images", f"images/{IMAGE_B:016x}.fimg")
    assert_fails(archive, "images", "checksum mismatch")


def test_verify_invalid_manifest_json(archive, capsys):
    m = archive / "manifest.json"
    m.write_text(m.read_text()[:-10])
    assert_fails(archive, "manifest", "not valid JSON", capsys)
    checks = checks_by_name(archive)
    assert checks["payload"].status == OK  # the rest is still checked as far as it can be
    assert checks["references"].status == SKIPPED


def test_verify_missing_image(archive):
    (archive / "images" / f"{IMAGE_B:016x}.fimg").unlink()
    assert_fails(archive, "kernel references", f"names image {IMAGE_B:016x}, not in images/")


def test_verify_extra_file(archive, capsys):
    (archive / "notes.txt").write_text("hello")
    (archive / "images" / "stray.bin").write_bytes(b"x")
    assert_fails(archive, "files", "unexpected file notes.txt", capsys)
    assert_fails(archive, "files", "unexpected file images/stray.bin")


def test_verify_symlink_inside(archive, tmp_path):
    outside = tmp_path / "elsewhere.fimg"
    shutil.copy(archive / "images" / f"{IMAGE_B:016x}.fimg", outside)
    (archive / "images" / f"{IMAGE_B:016x}.fimg").unlink()
    (archive / "images" / f"{IMAGE_B:016x}.fimg").symlink_to(outside)
    assert_fails(archive, "symbolic links", f"images/{IMAGE_B:016x}.fimg is a symbolic link")
    assert_fails(archive, "images", "symbolic link")  # the container reader refuses to follow it


def test_verify_kernel_naming_a_missing_entry(tmp_path):
    doc = payload_doc()
    doc["templates"][1]["nodes"][0] = kernel(IMAGE_B, "no_such_kernel")
    path = make_archive(tmp_path / "a", payload=doc)
    assert_fails(path, "kernel references", f"kernel no_such_kernel is not an entry of image {IMAGE_B:016x}")


def test_a_delta_may_run_another_kernel_and_verify_resolves_it(tmp_path):
    # Which kernel a node runs is per graph (LOAD writes it into the template's node); verify
    # still checks that the delta's kernel is in a packed image.
    doc = payload_doc()
    doc["members"][1]["delta"][0]["value"] = kernel(IMAGE_C, KERNEL)
    path = make_archive(tmp_path / "a", payload=doc)
    assert_fails(path, "kernel references", f"{IMAGE_C:016x}")


def test_a_delta_cannot_change_launch_attributes(tmp_path):
    # Node attributes stay the template's: a graph with other ones is another topology.
    doc = payload_doc()
    value = kernel(IMAGE_A, KERNEL, grid=16)
    value["kernel"]["attrs"] = [{"id": 8, "value": "0100000000000000"}]
    doc["members"][1]["delta"][0]["value"] = value
    with pytest.raises(FormatError, match="changes the topology"):
        make_archive(tmp_path / "a", payload=doc)


def test_verify_manifest_graph_not_in_payload(tmp_path):
    path = make_archive(tmp_path / "a", manifest=manifest_doc(["bs=1", "bs=2", "prefill", "ghost"]))
    assert_fails(path, "graph references", "manifest graph 'ghost' is not in the payload")


def test_verify_graph_order(tmp_path):
    path = make_archive(tmp_path / "a", manifest=manifest_doc(["bs=2", "bs=1", "prefill"]))
    assert_fails(path, "graph references", "another order")


def test_verify_output_outside_the_region(tmp_path):
    manifest = manifest_doc(["bs=1", "bs=2", "prefill"])
    manifest["graphs"][2]["outputs"] = output(REGION_BASE + REGION_SIZE - 16)  # 32 bytes from 16 before the end
    path = make_archive(tmp_path / "a", manifest=manifest)
    assert_fails(path, "output references", "graph 'prefill' output 0")


def test_verify_log_name_escaping_the_archive(tmp_path):
    manifest = manifest_doc(["bs=1", "bs=2", "prefill"])
    manifest["log"] = "../alloc_log.json"
    path = make_archive(tmp_path / "a", manifest=manifest)
    assert_fails(path, "manifest", "not a plain file name")


def test_verify_each_rank(tmp_path):
    root = tmp_path / "multi"
    make_archive(root / "rank0")
    make_archive(root / "rank1")
    (root / "rank1" / "graphs.fgr").write_bytes(b"FDRYCNT1")
    checks = checks_by_name(root)
    assert checks["ranks"].status == OK
    assert checks["rank0: payload"].status == OK
    assert checks["rank1: payload"].status == FAIL and "truncated" in checks["rank1: payload"].detail


def test_verify_an_engine_archive_with_its_state_and_carried_caches(tmp_path):
    root = tmp_path / "engine"
    make_archive(root / "rank0")
    (root / "engine.json").write_text("{}")
    (root / "rank0" / "engine_state.json").write_text("{}")
    (tmp_path / "triton" / "KEY").mkdir(parents=True)
    (tmp_path / "triton" / "KEY" / "k.cubin").write_bytes(b"cubin")
    caches = HostCaches(root, root / "rank0")
    caches.add_tree("triton", tmp_path / "triton", "KEY")
    caches.write_list()
    checks = checks_by_name(root)
    assert checks["ranks"].status == OK and checks["rank0: files"].status == OK
    assert checks["host caches"].status == OK and "1 carried files" in checks["host caches"].detail
    (root / "stray").write_text("")
    assert "unexpected file stray" in checks_by_name(root)["ranks"].detail


def test_verify_not_an_archive(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "verify", str(tmp_path))
    assert code == 1 and "FAIL" in out and "no manifest.json" in out


# ---- diff -------------------------------------------------------------------------------------


def test_diff_identical(tmp_path, capsys):
    a = make_archive(tmp_path / "a")
    b = make_archive(tmp_path / "b")
    code, out, _ = run_cli(capsys, "diff", str(a), str(b))
    assert code == 0 and "identical" in out


def test_diff_different(tmp_path, capsys):
    a = make_archive(tmp_path / "a")
    doc = payload_doc()
    doc["members"].append({"name": "bs=4", "template": 1, "delta": [], "refs": []})
    doc["members"][0]["delta"] = [{"node": 2, "value": kernel(IMAGE_A, KERNEL, grid=8, params="0000006001000000")}]
    doc["templates"][1]["nodes"][0] = kernel(IMAGE_C, "other_gemm", grid=64)
    manifest = manifest_doc(["bs=1", "bs=2", "prefill", "bs=4"])
    manifest["fingerprint"]["gpu_name"] = "NVIDIA H100"
    b = make_archive(tmp_path / "b", payload=doc, manifest=manifest)
    write_image(b / "images", IMAGE_C, ["other_gemm"], PTX)
    code, out, _ = run_cli(capsys, "diff", str(a), str(b))
    assert code == 1
    lines = out.splitlines()
    assert "fingerprint: gpu_name: 'NVIDIA H200' (A) vs 'NVIDIA H100' (B)" in lines
    assert "graphs: only in B: 'bs=4'" in lines
    assert "graph 'bs=1': same topology, parameters differ at 1 nodes (2)" in lines
    assert "graph 'prefill': kernel sequences differ from kernel 0: gemm_kernel (A) vs other_gemm (B)" in lines
    assert f"kernels: only in B: {IMAGE_C:016x}:other_gemm" in lines
    assert f"images: only in B: {IMAGE_C:016x}" in lines
    assert not any(ln.startswith("groups") for ln in lines)


def test_diff_names_a_kernel_restored_with_another_cache_preference(tmp_path, capsys):
    a = make_archive(tmp_path / "a")
    b = make_archive(tmp_path / "b", payload=with_gemm_preferring_shared(payload_doc()))
    code, out, _ = run_cli(capsys, "diff", str(a), str(b))
    assert code == 1
    lines = out.splitlines()
    assert f"kernels: cache preference of {IMAGE_B:016x}:{GEMM}: prefer_none (A) vs prefer_shared (B)" in lines
    assert "graph 'prefill': same topology, parameters differ at 1 nodes (0)" in lines


def test_diff_groups_and_topology(tmp_path, capsys):
    a = make_archive(tmp_path / "a")
    doc = copy.deepcopy(payload_doc())
    doc["templates"][0]["edges"][3]["type"] = 0
    doc["templates"].append({"nodes": [{"kind": "empty"}], "edges": [], "children": []})
    doc["members"][2]["template"] = 2
    b = make_archive(tmp_path / "b", payload=doc)
    code, out, _ = run_cli(capsys, "diff", str(a), str(b))
    assert code == 1
    assert "groups: 2 (A) vs 3 (B)" in out
    assert "graph 'bs=1': edges or child graphs differ" in out
    assert "graph 'prefill': node kinds differ from node 0: kernel (A) vs empty (B)" in out


def test_diff_of_an_unreadable_archive_is_an_error(tmp_path, capsys):
    a = make_archive(tmp_path / "a")
    code, _, err = run_cli(capsys, "diff", str(a), str(tmp_path / "missing"))
    assert code == 2 and "foundry diff:" in err
