"""scripts/carried_caches_check.py: after a LOAD on emptied caches, every file in the carried
caches must be one the archive listed, with its bytes and file time."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "carried_caches_check.py"
spec = importlib.util.spec_from_file_location("carried_caches_check", SCRIPT)
check_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_mod)


def _archive(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, Path]:
    root = tmp_path / "fi"
    listed = {}
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.utime(p, ns=(1_000_000_000, 1_000_000_000))
        listed[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "mtime_ns": 1_000_000_000}
    archive = tmp_path / "archive"
    (archive / "rank0").mkdir(parents=True)
    (archive / "rank0" / "host_caches.json").write_text(json.dumps({"roots": {"flashinfer": str(root)},
                                                                     "caches": {"flashinfer": listed}}))
    return archive, root


def test_only_carried_files_pass(tmp_path):
    archive, root = _archive(tmp_path, {"cached_ops/norm/norm.so": b"ELF", "cached_ops/norm/.ninja_log": b"log"})
    (root / "cached_ops" / "tmp").mkdir()
    (root / "cached_ops" / "tmp" / "norm.lock").write_text("")  # written by every start
    assert check_mod.check(archive) == (2, [])


def test_a_compiled_changed_or_rewritten_file_is_named(tmp_path):
    archive, root = _archive(tmp_path, {"a.so": b"ELF", "b.so": b"ELF2"})
    (root / "c.so").write_bytes(b"new")
    (root / "a.so").write_bytes(b"ELF")  # same bytes, rewritten: a new file time
    (root / "b.so").write_bytes(b"XXXX")
    os.utime(root / "b.so", ns=(1_000_000_000, 1_000_000_000))
    _, problems = check_mod.check(archive)
    assert any("c.so (not in the archive" in p for p in problems)
    assert any("a.so (rewritten" in p for p in problems)
    assert any("b.so (other bytes)" in p for p in problems)
    assert check_mod.main([str(archive)]) == 1


def test_a_cache_at_another_path_is_read_there(tmp_path):
    archive, root = _archive(tmp_path, {"a.so": b"ELF"})
    elsewhere = tmp_path / "new-host" / "fi"
    elsewhere.mkdir(parents=True)
    (elsewhere / "a.so").write_bytes(b"ELF")
    os.utime(elsewhere / "a.so", ns=(1_000_000_000, 1_000_000_000))
    (elsewhere / "k.so").write_bytes(b"built here")
    checked, problems = check_mod.check(archive, {"flashinfer": str(elsewhere)})
    assert checked == 1 and len(problems) == 1 and "k.so (not in the archive" in problems[0]
    assert check_mod.main([str(archive), "--at", f"flashinfer={elsewhere}"]) == 1
    assert check_mod.main([str(archive)]) == 0  # the saving host's path holds only carried files
    assert check_mod.main([str(archive), "--at"]) == 2
    assert check_mod.main([str(archive), "--in", "flashinfer=x"]) == 2


def test_two_caches_at_one_root_are_checked_together(tmp_path):
    # Triton's kernels and its modules built at import share Triton's cache directory.
    archive, root = _archive(tmp_path, {"k1/kernel.cubin": b"SASS"})
    (root / "m1").mkdir()
    (root / "m1" / "cuda_utils.so").write_bytes(b"ELF")
    listed = json.loads((archive / "rank0" / "host_caches.json").read_text())
    listed["roots"]["triton-at-import"] = str(root)
    listed["caches"]["triton-at-import"] = {"m1/cuda_utils.so": {"size": 3, "sha256": hashlib.sha256(b"ELF").hexdigest()}}
    (archive / "rank0" / "host_caches.json").write_text(json.dumps(listed))
    assert check_mod.check(archive) == (2, [])


def test_with_at_only_the_named_caches_are_checked_and_an_unknown_name_is_refused(tmp_path, capsys):
    archive, root = _archive(tmp_path, {"a.so": b"ELF"})
    listed = json.loads((archive / "rank0" / "host_caches.json").read_text())
    listed["roots"]["triton"] = str(tmp_path / "saving-host-triton")
    listed["caches"]["triton"] = {}
    (archive / "rank0" / "host_caches.json").write_text(json.dumps(listed))
    (tmp_path / "saving-host-triton").mkdir()
    (tmp_path / "saving-host-triton" / "k.cubin").write_bytes(b"this host's own")  # not the LOAD's cache
    assert check_mod.check(archive, {"flashinfer": str(root)}) == (1, [])
    assert check_mod.main([str(archive), "--at", f"inductor={root}"]) == 2
    assert "carries no cache named inductor (it carries flashinfer, triton)" in capsys.readouterr().err
