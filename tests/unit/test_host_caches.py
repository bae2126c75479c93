"""Host caches carried in the archive (foundry_core.engine.host_caches, .triton_cache, the vLLM
plugin's compile_cache, `foundry verify`): what SAVE carries, what LOAD puts back on a fresh
host, and what it refuses. Triton is a stand-in with Triton's file-cache semantics."""

from __future__ import annotations

import json
import logging
import os
import sys
import types
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from foundry_core.engine import host_caches, triton_cache, worker
from foundry_core.engine.cache_carry import CachesAhead
from foundry_core.engine.host_caches import CacheTree, Entry, HostCaches, parse_list
from foundry_core.engine.mode import Mode
from foundry_core.engine.triton_cache_manager import manager_class
from foundry_core.errors import FormatError
from foundry_core.verify import FAIL, OK, verify_archive

from vllm_foundry import compile_cache

# ---- a Triton stand-in: FileCacheManager's behaviour, knobs.cache.manager_class ----------------


class FakeFileCacheManager:
    """Triton's FileCacheManager as it behaves: a key directory under TRITON_CACHE_DIR made on
    construction, files put through a temporary directory, groups naming members by absolute path."""

    def __init__(self, key, override=False, dump=False):
        self.key = key
        self.cache_dir = os.path.join(os.environ["TRITON_CACHE_DIR"], key)
        os.makedirs(self.cache_dir, exist_ok=True)

    def put(self, data, filename, binary=True):
        tmp = os.path.join(self.cache_dir, f"tmp.pid_{os.getpid()}_{uuid.uuid4()}")
        os.makedirs(tmp)
        path = os.path.join(self.cache_dir, filename)
        Path(tmp, filename).write_bytes(data if isinstance(data, bytes) else str(data).encode())
        os.replace(os.path.join(tmp, filename), path)
        os.removedirs(tmp)
        return path

    def put_group(self, filename, group):
        return self.put(json.dumps({"child_paths": group}), f"__grp__{filename}")

    def get_group(self, filename):
        path = os.path.join(self.cache_dir, f"__grp__{filename}")
        if not os.path.exists(path):
            return None
        children = json.loads(Path(path).read_text())["child_paths"]
        return {name: p for name, p in children.items() if os.path.exists(p)}


class FakeCacheKnobs:
    def __init__(self):
        self.chosen = None
        self.env_choice = None  # what TRITON_CACHE_MANAGER would give

    manager_class = property(lambda self: self.chosen if self.chosen is not None else self.env_choice,
                             lambda self, cls: setattr(self, "chosen", cls),
                             lambda self: setattr(self, "chosen", None))
    dir = property(lambda self: os.environ["TRITON_CACHE_DIR"])  # read at each use, as Triton's knob is


@pytest.fixture
def fake_triton(monkeypatch, tmp_path):
    knobs = types.ModuleType("triton.knobs")
    knobs.cache = FakeCacheKnobs()
    cache_module = types.ModuleType("triton.runtime.cache")
    cache_module.FileCacheManager = FakeFileCacheManager
    package = types.ModuleType("triton")
    package.knobs = knobs
    for name, module in {"triton": package, "triton.knobs": knobs, "triton.runtime": types.ModuleType("x"),
                         "triton.runtime.cache": cache_module}.items():
        monkeypatch.setitem(sys.modules, name, module)
    manager_class.cache_clear()
    yield knobs.cache
    triton_cache.uninstall()
    manager_class.cache_clear()


def compile_kernel(key: str) -> FakeFileCacheManager:
    """What Triton does for a kernel it has not compiled: opens the key, puts the files and group."""
    manager = (triton_cache.current() and sys.modules["triton"].knobs.cache.manager_class or FakeFileCacheManager)(key)
    paths = {name: manager.put(f"{key}:{name}".encode(), name) for name in ("k.cubin", "k.json")}
    manager.put_group("k.json", paths)
    return manager


def open_kernel(key: str) -> dict | None:
    """What Triton does at a later start: opens the key and reads the group."""
    return sys.modules["triton"].knobs.cache.manager_class(key).get_group("k.json")


# ---- HostCaches ---------------------------------------------------------------------------------


def tree_of(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def blob(archive: Path, content: bytes) -> Path:
    return archive / host_caches.CACHES_DIR / Entry.of(content).sha256


def test_a_tree_carried_at_save_is_put_back_where_a_fresh_host_lacks_it(tmp_path):
    host = tree_of(tmp_path / "host", {"c/H/a.bin": b"a", "c/H/sub/b.bin": b"bb", "c/H/tmp.pid_1_x/partial": b"?",
                                       "c/H/.b.bin.tmp.9.abcd": b"?", "c/H/model.77.tmp": b"?",
                                       "c/H/.x.3.4.tmp": b"?", "c/other/x": b"x"})
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    done = caches.add_tree("comp", host, "c/H")
    caches.write_list()
    assert (done.files, done.bytes) == (2, 3)  # unfinished writes (Triton's, ours, vLLM's, Inductor's) left out
    assert blob(archive, b"bb").read_bytes() == b"bb"  # stored by content
    assert sorted(caches.paths("comp")) == ["c/H/a.bin", "c/H/sub/b.bin"]

    fresh = tree_of(tmp_path / "fresh", {"c/H/a.bin": b"host's own"})
    loaded = HostCaches.read(archive, archive / "rank0")
    done = loaded.restore_tree("comp", fresh)
    assert (done.files, done.present, done.refused) == (1, 1, 0)
    assert (fresh / "c/H/sub/b.bin").read_bytes() == b"bb"
    assert (fresh / "c/H/a.bin").read_bytes() == b"host's own"  # never overwritten


def test_keep_leaves_files_out(tmp_path):
    host = tree_of(tmp_path / "host", {"H/rank_0_0/m": b"0", "H/rank_1_0/m": b"1", "H/inductor/k": b"k"})
    caches = HostCaches(tmp_path / "a", tmp_path / "a" / "rank0")
    caches.add_tree("comp", host, "H", keep=compile_cache.own_rank_only("rank_0_0"))
    assert sorted(caches.paths("comp")) == ["H/inductor/k", "H/rank_0_0/m"]


def test_ranks_carrying_the_same_file_store_it_once_and_others_their_own(tmp_path):
    host = tree_of(tmp_path / "host", {"H/shared": b"same"})
    archive = tmp_path / "a"
    first, second = HostCaches(archive, archive / "rank0"), HostCaches(archive, archive / "rank1")
    assert first.add_tree("comp", host, "H").files == 1
    assert second.add_tree("comp", host, "H").present == 1
    (host / "H/shared").write_bytes(b"other bytes")  # a rank (or a later SAVE) that read other bytes
    third = HostCaches(archive, archive / "rank2")
    assert third.add_tree("comp", host, "H").files == 1
    for caches in (first, third):
        caches.write_list()
    for rank, expected in ((0, b"same"), (2, b"other bytes")):
        fresh = tmp_path / f"fresh{rank}"
        HostCaches.read(archive, archive / f"rank{rank}").restore_tree("comp", fresh)
        assert (fresh / "H/shared").read_bytes() == expected


def test_a_corrupt_carried_file_leaves_the_whole_tree_to_the_engine(tmp_path, caplog):
    host = tree_of(tmp_path / "host", {"H/a": b"aaaa", "H/b": b"bbbb"})
    archive = tmp_path / "a"
    caches = HostCaches(archive, archive / "rank0")
    caches.add_tree("comp", host, "H")
    caches.write_list()
    blob(archive, b"bbbb").write_bytes(b"bbbX")
    fresh = tmp_path / "fresh"
    with caplog.at_level(logging.WARNING, logger="foundry"):
        done = HostCaches.read(archive, archive / "rank0").restore_tree("comp", fresh)
    assert done.files == 0 and done.refused == 2 and not (fresh / "H/a").exists()
    assert "comp file H/b not used: its SHA-256 differs" in caplog.text
    assert not [p for p in fresh.rglob("*") if p.is_file()]  # no temporary file left behind


@pytest.mark.parametrize("kind", ["fifo", "symlink", "larger", "directory link"])
def test_a_carried_file_that_is_not_the_listed_regular_file_is_refused_without_reading_it(tmp_path, kind, caplog):
    host = tree_of(tmp_path / "host", {"H/a": b"aaaa"})
    archive = tmp_path / "a"
    caches = HostCaches(archive, archive / "rank0")
    caches.add_tree("comp", host, "H")
    caches.write_list()
    path = blob(archive, b"aaaa")
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)  # would block a plain read for good
    elif kind == "symlink":
        path.symlink_to(host / "H/a")
    elif kind == "larger":
        path.write_bytes(b"aaaa" * 1000)
    else:
        elsewhere = tmp_path / "elsewhere"
        (archive / host_caches.CACHES_DIR).rename(elsewhere)
        (elsewhere / path.name).write_bytes(b"aaaa")
        (archive / host_caches.CACHES_DIR).symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="foundry"):
        done = HostCaches.read(archive, archive / "rank0").restore_tree("comp", tmp_path / "fresh")
    assert done.refused == 1 and not (tmp_path / "fresh/H/a").exists() and "not used" in caplog.text
    assert {c.name: c for c in verify_archive(archive)}["host caches"].status == FAIL


def test_a_failed_write_leaves_nothing_of_the_unit(tmp_path):
    host = tree_of(tmp_path / "host", {"H/a": b"a", "H/sub/b": b"b"})
    archive = tmp_path / "a"
    caches = HostCaches(archive, archive / "rank0")
    caches.add_tree("comp", host, "H")
    caches.write_list()
    fresh = tree_of(tmp_path / "fresh", {"H/sub": b"a file where the unit needs a directory"})
    with pytest.raises(OSError):
        HostCaches.read(archive, archive / "rank0").restore_tree("comp", fresh)
    assert sorted(p.name for p in (fresh / "H").iterdir()) == ["sub"]


def test_the_files_a_reader_looks_for_first_are_placed_last(tmp_path, monkeypatch):
    host = tree_of(tmp_path / "host", {"H/__grp__k.json": b"g", "H/k.cubin": b"c", "H/k.json": b"j"})
    archive = tmp_path / "a"
    caches = HostCaches(archive, archive / "rank0")
    caches.add_tree("comp", host, "H")
    placed = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: placed.append(Path(dst).name) or real_replace(src, dst))
    caches.restore_tree("comp", tmp_path / "fresh", last=lambda rel: rel.endswith("__grp__k.json"))
    assert placed[-1] == "__grp__k.json" and len(placed) == 3


def test_an_unreadable_list_is_logged_and_nothing_is_carried(tmp_path, caplog):
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / host_caches.LIST_NAME).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="foundry"):
        assert HostCaches.read(tmp_path, tmp_path / "rank0") is None
    assert "host caches are not used" in caplog.text and "not valid JSON" in caplog.text
    assert HostCaches.read(tmp_path / "none", tmp_path / "none" / "rank0") is None  # none carried: silent


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a//b", "a/./b", "a\\b", "", ".", "a/", "a\0b"])
def test_a_list_naming_a_path_outside_the_archive_is_refused(tmp_path, path):
    data = {"format": "foundry-host-caches", "version": 1, "caches": {"c": {path: {"size": 1, "sha256": "0" * 64}}}}
    with pytest.raises(FormatError, match="not a relative path inside the archive"):
        parse_list(data, tmp_path / "l.json")


@pytest.mark.parametrize("field, value, message", [
    ("mtime_ns", -1, "'mtime_ns' that is not a non-negative integer"),
    ("mtime_ns", True, "'mtime_ns' that is not a non-negative integer"),
    ("mtime_ns", "1", "'mtime_ns' that is not a non-negative integer"),
    ("size", True, "needs a size and a sha256")])
def test_a_list_entry_with_a_bad_field_is_refused(tmp_path, field, value, message):
    entry = {"size": 1, "sha256": "0" * 64, field: value}
    data = {"format": "foundry-host-caches", "version": 1, "caches": {"c": {"f": entry}}}
    with pytest.raises(FormatError, match=message):
        parse_list(data, tmp_path / "l.json")


@pytest.mark.parametrize("roots", [[], {"c": 3}, {"c": "relative/path"}])
def test_a_list_whose_roots_are_not_absolute_paths_is_refused(tmp_path, roots, caplog):
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / host_caches.LIST_NAME).write_text(json.dumps(
        {"format": "foundry-host-caches", "version": 1, "caches": {}, "roots": roots}))
    with caplog.at_level(logging.WARNING, logger="foundry"):
        assert HostCaches.read(tmp_path, tmp_path / "rank0") is None
    assert "'roots' is not an object of cache names and absolute paths" in caplog.text


def test_a_list_that_is_a_fifo_is_refused_without_reading_it(tmp_path, caplog):
    (tmp_path / "rank0").mkdir()
    os.mkfifo(tmp_path / "rank0" / host_caches.LIST_NAME)  # a plain read would block for good
    with caplog.at_level(logging.WARNING, logger="foundry"):
        assert HostCaches.read(tmp_path, tmp_path / "rank0") is None
    assert "not a regular file" in caplog.text


def test_modification_times_are_carried_where_a_tree_asks_and_placed_with_the_file(tmp_path):
    host = tree_of(tmp_path / "host", {"H/a": b"same", "H/b": b"same", "plain/c": b"c"})
    os.utime(host / "H/a", ns=(1_000_000_000_123, 1_000_000_000_123))
    os.utime(host / "H/b", ns=(2_000_000_000_456, 2_000_000_000_456))
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    assert caches.add_used(CacheTree("timed", host, ("H",), mtimes=True)).files == 1  # one stored copy of b"same"
    caches.add_tree("plain", host, "plain")
    caches.write_list()
    listed = json.loads((archive / "rank0" / host_caches.LIST_NAME).read_text())
    assert listed["caches"]["timed"]["H/a"]["mtime_ns"] == 1_000_000_000_123
    assert "mtime_ns" not in listed["caches"]["plain"]["plain/c"]
    assert listed["roots"] == {"plain": os.path.realpath(host), "timed": os.path.realpath(host)}
    assert {c.name: c for c in verify_archive(archive)}["host caches"].status == OK  # one blob, two times: fine
    fresh = tmp_path / "fresh"
    loaded = HostCaches.read(archive, archive / "rank0")
    loaded.restore(CacheTree("timed", fresh))
    loaded.restore_tree("plain", fresh)
    assert [(fresh / p).stat().st_mtime_ns for p in ("H/a", "H/b")] == [1_000_000_000_123, 2_000_000_000_456]
    assert (fresh / "plain/c").stat().st_mtime_ns > 2_000_000_000_456  # the time of placing


def test_carrying_can_be_turned_off():
    assert host_caches.enabled({}) and not host_caches.enabled({"FOUNDRY_HOST_CACHES": "0"})


# ---- Triton ----------------------------------------------------------------------------------


def test_a_fresh_host_loads_the_kernels_the_save_start_used(fake_triton, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "save-host"))
    compile_kernel("WARM")  # in the host's cache before the SAVE start
    triton_cache.install(triton_cache.TritonCarrier())
    assert fake_triton.manager_class is manager_class()
    assert open_kernel("WARM") is not None  # a SAVE start that found it: carried too
    compile_kernel("NEW")
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    done = triton_cache.current().carry(caches)
    assert (done.files, done.present) == (5, 1)  # the two group files are the same bytes once normalised
    caches.write_list()
    group = json.loads(blob(archive, b"").parent.joinpath(caches.entries["triton"]["NEW/__grp__k.json"].sha256)
                       .read_text())
    assert group["child_paths"]["k.cubin"] == f"{triton_cache.KEY_DIR}/k.cubin"  # no host path stored
    triton_cache.uninstall()

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh-host"))
    carrier = triton_cache.TritonCarrier(HostCaches.read(archive, archive / "rank0"))
    assert triton_cache.install(carrier)
    found = open_kernel("NEW")
    key_dir = tmp_path / "fresh-host" / "NEW"
    assert found == {"k.cubin": str(key_dir / "k.cubin"), "k.json": str(key_dir / "k.json")}
    assert (key_dir / "k.cubin").read_bytes() == b"NEW:k.cubin"
    assert open_kernel("UNKNOWN") is None  # not carried: Triton compiles as usual
    assert carrier.seeded.files == 3 and not (tmp_path / "fresh-host" / "WARM").exists()  # only keys looked up
    assert carrier.missing == ["UNKNOWN"]  # what this LOAD compiles on a new host, named in the log


def test_a_kernel_missing_from_the_archive_but_on_the_host_is_not_reported(fake_triton, tmp_path, monkeypatch,
                                                                           caplog):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "host"))
    triton_cache.install(triton_cache.TritonCarrier())
    compile_kernel("SAVED")
    carried_by_save(tmp_path / "archive")
    compile_kernel("LOCAL")  # compiled on this host after the SAVE
    carrier = triton_cache.TritonCarrier(HostCaches.read(tmp_path / "archive", tmp_path / "archive" / "rank0"))
    triton_cache.install(carrier)
    with caplog.at_level(logging.INFO, logger="foundry"):
        assert open_kernel("LOCAL") is not None and open_kernel("ELSE") is None
    triton_cache.uninstall()
    assert carrier.missing == ["ELSE"]
    assert "Triton cache entry ELSE is neither carried in the archive nor on this host" in caplog.text
    assert "LOCAL" not in caplog.text


def carried_by_save(archive: Path) -> HostCaches:
    """What the installed carrier's SAVE writes to ``archive``; the carrier is uninstalled after."""
    caches = HostCaches(archive, archive / "rank0")
    triton_cache.current().carry(caches)
    caches.write_list()
    triton_cache.uninstall()
    return caches


def test_a_kernel_already_on_the_host_is_left_alone(fake_triton, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "host"))
    triton_cache.install(triton_cache.TritonCarrier())
    compile_kernel("K")
    archive = tmp_path / "archive"
    carried_by_save(archive)
    carrier = triton_cache.TritonCarrier(HostCaches.read(archive, archive / "rank0"))
    triton_cache.install(carrier)
    assert open_kernel("K") is not None and carrier.seeded.files == 0 and carrier.seeded.present == 3


def test_only_kernels_of_tritons_own_directory_are_placed_ahead(fake_triton, tmp_path, monkeypatch):
    # SAVE: SGLang's kernel in Triton's own directory; then Inductor points Triton at its own
    # per-device directory (it sets TRITON_CACHE_DIR in the process) and compiles there.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "save-triton"))
    assert triton_cache.install(triton_cache.TritonCarrier())
    compile_kernel("ENGINE")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "save-inductor" / "triton" / "0"))
    compile_kernel("INDUCTOR")
    archive = tmp_path / "archive"
    caches = carried_by_save(archive)
    assert {cache: sorted({rel.split("/")[0] for rel in files}) for cache, files in caches.entries.items()} == {
        triton_cache.CACHE: ["ENGINE"], triton_cache.ELSEWHERE: ["INDUCTOR"]}

    # LOAD on a fresh host: the thread places the engine's kernel only; Inductor's is placed at
    # its lookup, in the directory Triton then opens.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "load-triton"))
    source = HostCaches.read(archive, archive / "rank0")
    carrier = triton_cache.TritonCarrier(source)
    assert triton_cache.install(carrier) and carrier.home == os.path.realpath(tmp_path / "load-triton")
    ahead = CachesAhead(source, [], triton=carrier).start()
    assert ahead.wait().files == 3
    assert sorted(os.listdir(tmp_path / "load-triton")) == ["ENGINE"]
    inductor_dir = tmp_path / "load-inductor" / "triton" / "0"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(inductor_dir))
    assert open_kernel("INDUCTOR") == {"k.cubin": str(inductor_dir / "INDUCTOR" / "k.cubin"),
                                       "k.json": str(inductor_dir / "INDUCTOR" / "k.json")}


def test_an_unknown_triton_directory_carries_every_kernel_as_placed_ahead(fake_triton, tmp_path, caplog):
    carrier = triton_cache.TritonCarrier()
    with caplog.at_level(logging.INFO, logger="foundry"):
        assert triton_cache.install(carrier)  # no TRITON_CACHE_DIR: the stand-in's knob cannot say
    assert carrier.home is None and "Triton's cache directory is unknown" in caplog.text
    assert carrier.cache_of(str(tmp_path / "anywhere" / "K")) == triton_cache.CACHE


def test_a_users_own_cache_manager_is_kept(fake_triton, caplog):
    fake_triton.env_choice = FakeFileCacheManager
    with caplog.at_level(logging.INFO, logger="foundry"):
        assert not triton_cache.install(triton_cache.TritonCarrier())
    assert triton_cache.current() is None and fake_triton.manager_class is FakeFileCacheManager
    assert "chooses another cache manager" in caplog.text


def test_without_triton_nothing_is_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    assert not triton_cache.install(triton_cache.TritonCarrier()) and triton_cache.current() is None


def test_a_carrier_failure_never_fails_triton(fake_triton, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "host"))
    carrier = triton_cache.TritonCarrier()
    monkeypatch.setattr(carrier, "looked_up", lambda key, directory: 1 / 0)
    triton_cache.install(carrier)
    with caplog.at_level(logging.WARNING, logger="foundry"):
        assert compile_kernel("K").get_group("k.json") is not None
    assert "Triton cache entry K not carried" in caplog.text


# ---- vLLM's compile cache ----------------------------------------------------------------------


def test_the_compile_directories_vllm_used(tmp_path):
    root = tmp_path / "vllm"
    aot = root / "torch_compile_cache/torch_aot_compile/abc123"
    pieces = root / "torch_compile_cache/0f1e2d"
    for d in (aot / "rank_0_0", pieces / "rank_0_0/backbone"):
        d.mkdir(parents=True)
    assert compile_cache.hash_dir(aot / "rank_0_0/model", root) == "torch_compile_cache/torch_aot_compile/abc123"
    assert compile_cache.hash_dir(pieces / "rank_0_0/backbone", root) is None
    assert compile_cache.hash_dir(tmp_path / "elsewhere", root) is None
    assert compile_cache.hash_dir("", root) is None
    config = SimpleNamespace(cache_dir=str(pieces), local_cache_dir=str(aot))
    assert compile_cache.used_dirs(config, root) == ("torch_compile_cache/torch_aot_compile/abc123",)
    vllm_config = SimpleNamespace(compilation_config=SimpleNamespace(cache_dir="", local_cache_dir=str(aot)),
                                  parallel_config=SimpleNamespace(rank=1, data_parallel_index=0))
    tree = compile_cache.tree(vllm_config, root)
    assert tree.used == ("torch_compile_cache/torch_aot_compile/abc123",)
    # A start that compiled: vLLM's backend replaced local_cache_dir with its pieces' directory
    # (not carried: its index names absolute paths); the compiled module names its AOT directory.
    vllm_config.compilation_config = SimpleNamespace(cache_dir=str(pieces),
                                                     local_cache_dir=str(pieces / "rank_0_0/backbone"))
    compiled = SimpleNamespace(_aot_cache_dir=str(aot / "rank_1_0"))
    model = SimpleNamespace(modules=lambda: iter([SimpleNamespace(), compiled]))
    assert compile_cache.tree(vllm_config, root, model=model).used == ("torch_compile_cache/torch_aot_compile/abc123",)
    assert compile_cache.unit("torch_compile_cache/torch_aot_compile/abc123/rank_1_0/model") == \
        "torch_compile_cache/torch_aot_compile/abc123"
    assert compile_cache.unit("modelinfos/q.json") == "modelinfos/q.json"
    assert compile_cache.is_artifact("x/rank_1_0/model") and not compile_cache.is_artifact("x/inductor_cache/m.py")
    assert compile_cache.aot_dirs(SimpleNamespace(runnable=model)) == (str(aot / "rank_1_0"),)
    assert compile_cache.aot_dirs(None) == ()
    assert tree.keep("x/rank_1_0/model") and not tree.keep("x/rank_0_0/model") and tree.keep("x/inductor_cache/k")


# ---- the runtime: SAVE carries after the warmup, LOAD puts back at launch -----------------------


class CarryingRuntime(worker.WorkerRuntime):
    carries_host_caches = True

    def __init__(self, session, root: Path, used: tuple[str, ...] = ()):
        super().__init__(session, adapter=None)
        self.tree = CacheTree("comp", root, used)

    def host_cache_trees(self):
        return [self.tree]


def session_at(archive: Path, mode: Mode) -> SimpleNamespace:
    return SimpleNamespace(mode=mode, archive=archive, rank_dir=archive / "rank0", begin=lambda: None)


def test_the_runtime_carries_at_save_and_restores_at_load(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(triton_cache, "install", lambda carrier: False)
    host = tree_of(tmp_path / "host", {"cc/H/rank_0_0/model": b"compiled", "cc/H/inductor/k.py": b"code"})
    archive = tmp_path / "archive"
    saving = CarryingRuntime(session_at(archive, Mode.SAVE), host, ("cc/H",)).launch(0, archive)
    saving.carry_caches_out()
    assert not (archive / "rank0" / host_caches.LIST_NAME).exists()  # nothing saved, nothing carried
    saving.saved = True
    with caplog.at_level(logging.INFO, logger="foundry"):
        saving.carry_caches_out()
    assert "compile caches carried in the archive: 2 files" in caplog.text
    checks = {c.name: c for c in verify_archive(archive)}
    assert checks["host caches"].status == OK and "2 carried files" in checks["host caches"].detail

    fresh = tmp_path / "fresh"
    CarryingRuntime(session_at(archive, Mode.LOAD), fresh).launch(0, archive)
    assert (fresh / "cc/H/rank_0_0/model").read_bytes() == b"compiled"
    monkeypatch.setenv("FOUNDRY_HOST_CACHES", "0")
    off = tmp_path / "off"
    CarryingRuntime(session_at(archive, Mode.LOAD), off).launch(0, archive)
    assert not off.exists()
    monkeypatch.delenv("FOUNDRY_HOST_CACHES")
    CarryingRuntime.carries_host_caches = False  # a plugin that does not carry (SGLang's)
    try:
        CarryingRuntime(session_at(archive, Mode.LOAD), off).launch(0, archive)
    finally:
        CarryingRuntime.carries_host_caches = True
    assert not off.exists()


class CarryingAheadRuntime(CarryingRuntime):
    places_caches_ahead = True


def test_a_load_that_places_ahead_has_the_files_once_it_waited(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(triton_cache, "install", lambda carrier: False)
    host = tree_of(tmp_path / "host", {"cc/H/rank_0_0/model": b"compiled", "cc/H/inductor/k.py": b"code"})
    archive = tmp_path / "archive"
    saving = CarryingRuntime(session_at(archive, Mode.SAVE), host, ("cc/H",)).launch(0, archive)
    saving.saved = True
    saving.carry_caches_out()
    fresh = tmp_path / "fresh"
    loading = CarryingAheadRuntime(session_at(archive, Mode.LOAD), fresh).launch(0, archive)
    assert loading._ahead is not None  # placing on its thread: launch did not wait for it
    with caplog.at_level(logging.INFO, logger="foundry"):
        loading.wait_caches()
    assert (fresh / "cc/H/rank_0_0/model").read_bytes() == b"compiled"
    assert "JIT caches from the archive: 2 files" in caplog.text and "on a thread" in caplog.text
    loading.wait_caches()  # once: a second wait does nothing


def test_verify_names_a_carried_file_that_changed(tmp_path):
    host = tree_of(tmp_path / "host", {"H/a": b"aaaa"})
    archive = tmp_path / "archive"
    (archive / "rank0").mkdir(parents=True)
    caches = HostCaches(archive, archive / "rank0")
    caches.add_tree("comp", host, "H")
    caches.write_list()
    blob(archive, b"aaaa").write_bytes(b"aaaX")
    blob(archive, b"left by an earlier SAVE").write_bytes(b"left by an earlier SAVE")
    check = {c.name: c for c in verify_archive(archive)}["host caches"]
    assert check.status == FAIL and f"{blob(archive, b'aaaa').name} differs from its size or SHA-256" in check.detail
    blob(archive, b"aaaa").write_bytes(b"aaaa")
    check = {c.name: c for c in verify_archive(archive)}["host caches"]
    assert check.status == OK and "1 files no rank lists" in check.detail
    (archive / host_caches.CACHES_DIR / "stray").write_bytes(b"")
    assert "unexpected file host_caches/stray" in {c.name: c for c in verify_archive(archive)}["host caches"].detail


def test_vllm_carries_after_its_warmup_at_save_and_reports_at_load(caplog):
    from vllm_foundry import worker_patches

    calls = []
    rt = SimpleNamespace(mode=Mode.SAVE, carry_caches_out=lambda: calls.append("carry"),
                         seeded_summary=lambda: "Triton kernels from the archive: 3 files")
    worker_patches._after_warmup(rt)
    assert calls == ["carry"]
    rt.mode = Mode.LOAD
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        worker_patches._after_warmup(rt)
    assert calls == ["carry"] and "foundry: Triton kernels from the archive: 3 files" in caplog.text


def test_the_first_process_gets_the_model_info_before_vllm_inspects_the_model(tmp_path, monkeypatch):
    from vllm_foundry import activation

    aot = "torch_compile_cache/torch_aot_compile/abc"
    saved_root = tree_of(tmp_path / "save-host", {"modelinfos/qwen3-Qwen3ForCausalLM.json": b'{"hash": "h"}',
                                                  f"{aot}/rank_0_0/model": b"m"})
    vllm_config = SimpleNamespace(compilation_config=SimpleNamespace(local_cache_dir=str(saved_root / aot)),
                                  parallel_config=SimpleNamespace(rank=0, data_parallel_index=0))
    tree = compile_cache.tree(vllm_config, saved_root)
    assert tree.used == (aot, "modelinfos")
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    for sub in tree.used:
        caches.add_tree(tree.cache, tree.root, sub)
    caches.write_list()

    fresh = tmp_path / "fresh"
    monkeypatch.setattr(compile_cache, "cache_root", lambda: fresh)
    settings = SimpleNamespace(mode=Mode.LOAD, archive=archive)
    activation._reset_for_tests()
    activation._restore_model_info(settings)
    assert (fresh / "modelinfos/qwen3-Qwen3ForCausalLM.json").read_bytes() == b'{"hash": "h"}'
    assert not (fresh / "torch_compile_cache").exists()  # the worker's, not the first process's
    (fresh / "modelinfos/qwen3-Qwen3ForCausalLM.json").unlink()
    activation._restore_model_info(settings)  # once per process
    assert not (fresh / "modelinfos/qwen3-Qwen3ForCausalLM.json").exists()
    for mode, archive_dir in ((Mode.SAVE, archive), (Mode.LOAD, tmp_path / "no-archive")):
        activation._reset_for_tests()
        other = tmp_path / f"other-{mode}"
        monkeypatch.setattr(compile_cache, "cache_root", lambda other=other: other)
        activation._restore_model_info(SimpleNamespace(mode=mode, archive=archive_dir))
        assert not other.exists()
    activation._reset_for_tests()


def test_with_triton_itself(tmp_path, monkeypatch):
    """The same SAVE-then-new-host flow through Triton's own cache manager lookup."""
    pytest.importorskip("triton.knobs", reason="needs Triton 3.4 or later (not installed here)")
    from triton.runtime.cache import get_cache_manager

    manager_class.cache_clear()
    key = "ab" * 32  # Triton hashes are hex; get_cache_manager names the directory in base32
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "save-host"))
    try:
        assert triton_cache.install(triton_cache.TritonCarrier())
        manager = get_cache_manager(key)
        paths = {name: manager.put(b"x" + name.encode(), name) for name in ("k.cubin", "k.json")}
        manager.put_group("k.json", paths)
        archive = tmp_path / "archive"
        caches = HostCaches(archive, archive / "rank0")
        assert triton_cache.current().carry(caches).files == 3
        caches.write_list()
        triton_cache.uninstall()
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "new-host"))
        assert triton_cache.install(triton_cache.TritonCarrier(HostCaches.read(archive, archive / "rank0")))
        group = get_cache_manager(key).get_group("k.json")
        assert sorted(group) == ["k.cubin", "k.json"]
        assert all(p.startswith(str(tmp_path / "new-host")) and Path(p).read_bytes().startswith(b"x") for p in
                   group.values())
    finally:
        triton_cache.uninstall()
        manager_class.cache_clear()


def test_a_save_that_cannot_write_its_caches_keeps_its_graphs(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(triton_cache, "install", lambda carrier: False)
    host = tree_of(tmp_path / "host", {"cc/H/model": b"compiled"})
    archive = tmp_path / "archive"
    saving = CarryingRuntime(session_at(archive, Mode.SAVE), host, ("cc/H",)).launch(0, archive)
    saving.saved = True

    def full_disk(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(HostCaches, "write_list", full_disk)
    with caplog.at_level(logging.WARNING, logger="foundry"):
        saving.carry_caches_out()  # does not raise: the archive's graphs are complete already
    assert "compile caches not carried in the archive" in caplog.text and "No space left" in caplog.text
    assert not (archive / "rank0" / host_caches.LIST_NAME).exists()


@pytest.mark.parametrize("content", [b"not json", b"[1, 2]", b'{"child_paths": 3}', b'{"other": {}}'])
def test_a_group_file_triton_would_not_read_is_carried_as_it_is(content):
    assert triton_cache._rewrite_group(content, "/old/KEY", "/new/KEY") == content


def test_only_member_paths_inside_the_key_directory_move():
    group = json.dumps({"child_paths": {"a": "/old/KEY/a", "b": "/elsewhere/b", "c": 7}}).encode()
    moved = json.loads(triton_cache._rewrite_group(group, "/old/KEY", "/new/KEY"))
    assert moved["child_paths"] == {"a": "/new/KEY/a", "b": "/elsewhere/b", "c": 7}
