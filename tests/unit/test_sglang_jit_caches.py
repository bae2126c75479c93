"""What an SGLang start compiles on first use, carried in the archive (foundry_core.engine.jit_dirs,
.cache_carry, sglang_foundry.jit_caches): SAVE records the JIT modules the process loaded, LOAD
places them without replacing the host's files, a corrupt entry is refused and the start goes on
(its loader compiles), a tampered archive installs nothing. The modules are real shared libraries
built here with cc, found through this process's /proc/self/maps; ninja's own dry run says whether
a placed FlashInfer-style module would be rebuilt."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from foundry_core.engine import jit_dirs, triton_cache
from foundry_core.engine.cache_carry import CacheCarry, CachesAhead
from foundry_core.engine.host_caches import CacheTree, Entry, HostCaches
from foundry_core.engine.mode import Mode

from sglang_foundry import jit_caches
from test_sglang_plugin import clean_state, fake_sglang, fake_torch, scheduler  # noqa: F401 - its fixtures

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc) to build shared libraries")
needs_ninja = pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("cc") is None,
                                 reason="needs ninja and a C compiler (cc)")

VERSION_ARCH = "0.6.15.post1/90a"  # FlashInfer's <version>/<arch> under its cache
TVM_MODULE = "sgl_kernel_jit_silu_and_mul_0123456789abcdef"
TVM_DIR = f"{TVM_MODULE}__arch_sm90__tvmffi_0.1.11"
OLD = 1_600_000_000_000_000_000  # an installed package's files: older than any build here


def build_library(path: Path, symbol: str = "entry") -> Path:
    """A real shared library at ``path`` (what a JIT build leaves), built with cc."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.with_suffix(".c")
    source.write_text(f"int {symbol}(void) {{ return 7; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(path)], check=True)
    source.unlink()
    return path


def load(path: Path) -> ctypes.CDLL:
    """What a JIT loader does with a built module: dlopen it (the process maps the file)."""
    return ctypes.CDLL(str(path))


def tvm_ffi_build(root: Path, directory: str = TVM_DIR, module: str = TVM_MODULE) -> Path:
    """An SGLang load_jit build directory as tvm-ffi leaves it."""
    build = root / directory
    library = build_library(build / f"{module}.so")
    files = {"build.ninja": "rule link\n", "cuda.cu": "// source\n", "lock": "", ".ninja_log": "# ninja log v5\n"}
    for name, text in files.items():
        (build / name).write_text(text)
    return library


def placed_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """This host's FlashInfer and tvm-ffi caches, where their variables put them."""
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi-base"))
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path / "tvm-ffi"))
    monkeypatch.delitem(sys.modules, "flashinfer.jit.env", raising=False)  # FlashInfer's own root, when imported
    return SimpleNamespace(flashinfer=tmp_path / "fi-base" / ".cache" / "flashinfer", tvm_ffi=tmp_path / "tvm-ffi")


# ---- which modules a start used ------------------------------------------------------------------


def test_the_roots_follow_the_loaders_variables(roots):
    assert jit_dirs.flashinfer_root() == roots.flashinfer
    assert jit_dirs.tvm_ffi_root() == roots.tvm_ffi
    assert jit_dirs.tvm_ffi_root({}) == Path("~/.cache/tvm-ffi").expanduser()
    assert jit_dirs.flashinfer_root({}) == Path.home() / ".cache" / "flashinfer"


def test_an_imported_flashinfer_names_its_own_cache(roots, tmp_path, monkeypatch):
    own = tmp_path / "set-at-import" / ".cache" / "flashinfer"  # FlashInfer reads its variable once, at import
    monkeypatch.setitem(sys.modules, "flashinfer.jit.env", SimpleNamespace(FLASHINFER_CACHE_DIR=own))
    assert jit_dirs.flashinfer_root() == own


@needs_cc
def test_the_modules_a_process_loaded_are_read_from_its_maps(roots, tmp_path):
    library = tvm_ffi_build(roots.tvm_ffi)
    built = build_library(roots.flashinfer / VERSION_ARCH / "cached_ops" / "norm" / "norm.so")
    (roots.flashinfer / VERSION_ARCH / "generated" / "norm").mkdir(parents=True)
    elsewhere = build_library(tmp_path / "site-packages" / "aot.so")
    never_loaded = tvm_ffi_build(roots.tvm_ffi, "other__arch_sm90__tvmffi_0.1.11", "other")
    handles = [load(library), load(built), load(elsewhere)]
    mapped = jit_dirs.mapped_files()
    assert library in mapped and built in mapped and never_loaded not in mapped
    flashinfer, tvm_ffi = jit_dirs.trees()
    assert tvm_ffi.used == (TVM_DIR,)  # a build directory on the host that nothing loaded is not carried
    assert flashinfer.used == (f"{VERSION_ARCH}/cached_ops/norm", f"{VERSION_ARCH}/generated/norm")
    assert flashinfer.bound_to_root and flashinfer.mtimes and tvm_ffi.mtimes and not tvm_ffi.bound_to_root
    del handles


def test_maps_lines_with_spaces_and_deleted_files(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 12 /opt/a b/lib x.so\n"
                    "7f01-7f02 r--p 00001000 08:01 12 /opt/a b/lib x.so\n"
                    "7f02-7f03 rw-p 00000000 00:00 0 \n"
                    "7f03-7f04 r-xp 00000000 08:01 13 /tmp/gone.so (deleted)\n"
                    "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n")
    assert jit_dirs.mapped_files(maps) == [Path("/opt/a b/lib x.so")]
    assert jit_dirs.mapped_files(tmp_path / "none") == []


def test_flashinfer_units_and_tvm_ffi_units():
    assert jit_dirs.flashinfer_unit(f"{VERSION_ARCH}/cached_ops/norm/norm.so") == f"{VERSION_ARCH}/norm"
    assert jit_dirs.flashinfer_unit(f"{VERSION_ARCH}/generated/norm/config.inc") == f"{VERSION_ARCH}/norm"
    tree = jit_dirs.tvm_ffi_tree(Path("/nowhere"))
    assert tree.unit(f"{TVM_DIR}/x.so") == TVM_DIR and tree.last(f"{TVM_DIR}/x.so") and not tree.last("d/build.ninja")
    assert not tree.keep(f"{TVM_DIR}/lock") and not tree.keep("tmp/norm.lock") and tree.keep(f"{TVM_DIR}/cuda.cu")


# ---- FlashInfer: ninja decides, from files and their times -----------------------------------------


def flashinfer_module(root: Path, package: Path) -> Path:
    """A FlashInfer-style JIT module built by ninja as FlashInfer builds it: absolute paths in
    build.ninja, header dependencies through a depfile (deps = gcc), a generated source beside."""
    package.mkdir(parents=True)
    (package / "norm.h").write_text("#define SCALE 3\n")
    (package / "norm.c").write_text('#include "norm.h"\n#include "config.inc"\nint norm(void) { return SCALE * K; }\n')
    for name in ("norm.h", "norm.c"):
        os.utime(package / name, ns=(OLD, OLD))  # installed before any build
    generated = root / VERSION_ARCH / "generated" / "norm"
    generated.mkdir(parents=True)
    (generated / "config.inc").write_text("#define K 2\n")
    module = root / VERSION_ARCH / "cached_ops" / "norm"
    module.mkdir(parents=True)
    (module / "build.ninja").write_text(f"""ninja_required_version = 1.3
cc = cc
rule compile
  command = $cc -MMD -MF $out.d -I{generated} -fPIC -c $in -o $out
  depfile = $out.d
  deps = gcc
rule link
  command = $cc -shared $in -o $out
build {module}/norm.o: compile {package}/norm.c
build {module}/norm.so: link {module}/norm.o
default {module}/norm.so
""")
    ninja(module)
    return module


def ninja(module: Path, *flags: str) -> str:
    done = subprocess.run(["ninja", *flags, "-C", str(module), "-f", str(module / "build.ninja")], check=True,
                          capture_output=True, text=True)
    return done.stdout + done.stderr


def without_mtimes(caches: HostCaches) -> None:
    for files in caches.entries.values():
        for rel, entry in files.items():
            files[rel] = dataclasses.replace(entry, mtime_ns=None)


@needs_ninja
def test_a_flashinfer_module_placed_on_a_new_host_is_one_ninja_does_not_rebuild(roots, tmp_path):
    module = flashinfer_module(roots.flashinfer, tmp_path / "site-packages" / "flashinfer")
    assert "no work to do" in ninja(module, "-n")
    handle = load(module / "norm.so")
    tree = jit_dirs.flashinfer_tree(mapped=jit_dirs.mapped_files())
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    caches.add_used(tree)
    caches.write_list()
    listed = json.loads((archive / "rank0" / "host_caches.json").read_text())
    assert listed["roots"]["flashinfer"] == os.path.realpath(roots.flashinfer)
    files = listed["caches"]["flashinfer"]
    assert {f"{VERSION_ARCH}/cached_ops/norm/{n}" for n in ("norm.so", "norm.o", ".ninja_log", ".ninja_deps",
                                                           "build.ninja")} <= set(files)
    assert f"{VERSION_ARCH}/generated/norm/config.inc" in files
    assert files[f"{VERSION_ARCH}/cached_ops/norm/norm.so"]["mtime_ns"] == (module / "norm.so").stat().st_mtime_ns
    saved = placed_files(roots.flashinfer)
    times = {p: (roots.flashinfer / p).stat().st_mtime_ns for p in saved}

    # Placed with the time of placing, the files are ones ninja rebuilds (its records say older).
    shutil.rmtree(roots.flashinfer)  # a new host: the same image and user, empty caches
    time.sleep(0.01)
    stale = HostCaches.read(archive, archive / "rank0")
    without_mtimes(stale)
    stale.restore(tree)
    explained = ninja(module, "-n", "-d", "explain")
    assert "no work to do" not in explained and "stored deps info out of date" in explained

    shutil.rmtree(roots.flashinfer)
    done = HostCaches.read(archive, archive / "rank0").restore(tree)
    assert done.files == len(saved) and done.refused == 0
    assert placed_files(roots.flashinfer) == saved
    assert {p: (roots.flashinfer / p).stat().st_mtime_ns for p in saved} == times
    assert "no work to do" in ninja(module, "-n", "-d", "explain")
    del handle


@needs_ninja
def test_flashinfer_modules_are_placed_only_where_flashinfers_cache_was_at_save(roots, tmp_path, caplog):
    module = flashinfer_module(roots.flashinfer, tmp_path / "pkg")
    tree = jit_dirs.flashinfer_tree(mapped=[module / "norm.so"])
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    caches.add_used(tree)
    caches.write_list()
    elsewhere = dataclasses.replace(tree, root=tmp_path / "other-base" / ".cache" / "flashinfer")
    with caplog.at_level(logging.INFO, logger="foundry"):
        done = HostCaches.read(archive, archive / "rank0").restore(elsewhere)
    assert done.files == 0 and not elsewhere.root.exists()
    assert "flashinfer files are not placed: they were built in" in caplog.text and "absolute paths" in caplog.text


# ---- tvm-ffi: the .so is what SGLang's load_jit checks ----------------------------------------------


def sglang_reuses(root: Path, directory: str = TVM_DIR, module: str = TVM_MODULE) -> bool:
    """SGLang 0.5.17 load_jit: a built module is reused when ``<build dir>/<module>.so`` is a file."""
    return (root / directory / f"{module}.so").is_file()


@needs_cc
def test_tvm_ffi_builds_are_placed_anywhere_without_lock_files_and_never_over_the_hosts(roots, tmp_path):
    first = tvm_ffi_build(roots.tvm_ffi)
    second = tvm_ffi_build(roots.tvm_ffi, "sgl_kernel_jit_rmsnorm__arch_sm90__tvmffi_0.1.11", "sgl_kernel_jit_rmsnorm")
    handles = [load(first), load(second)]
    tree = jit_dirs.tvm_ffi_tree(mapped=jit_dirs.mapped_files())
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    caches.add_used(tree)
    caches.write_list()
    assert sorted(caches.paths("tvm_ffi")) == sorted(
        f"{d}/{n}" for d in (TVM_DIR, "sgl_kernel_jit_rmsnorm__arch_sm90__tvmffi_0.1.11")
        for n in (".ninja_log", "build.ninja", "cuda.cu", f"{d.split('__')[0]}.so"))  # no lock

    new_host = tmp_path / "new-host-tvm"  # tvm-ffi's builds name no path: any cache directory will do
    own = new_host / "sgl_kernel_jit_rmsnorm__arch_sm90__tvmffi_0.1.11" / "sgl_kernel_jit_rmsnorm.so"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"the host's own build")
    done = HostCaches.read(archive, archive / "rank0").restore(dataclasses.replace(tree, root=new_host))
    assert sglang_reuses(new_host) and (new_host / TVM_DIR / f"{TVM_MODULE}.so").read_bytes() == first.read_bytes()
    assert (new_host / TVM_DIR / "cuda.cu").stat().st_mtime_ns == (roots.tvm_ffi / TVM_DIR / "cuda.cu").stat(
    ).st_mtime_ns
    assert own.read_bytes() == b"the host's own build"  # never replaced,
    assert sorted(p.name for p in own.parent.iterdir()) == [own.name]  # nor mixed with the archive's
    assert (done.files, done.present, done.refused) == (4, 1, 0)
    assert not (new_host / TVM_DIR / "lock").exists()
    del handles


# ---- the SGLang plugin: begin (NCCL seam), placed (before the capture phase), carried (SAVE) -----------


def archive_with(tmp_path: Path, roots: SimpleNamespace) -> tuple[Path, HostCaches]:
    """An archive whose rank 0 carries one tvm-ffi module and one FlashInfer module."""
    tvm_ffi_build(roots.tvm_ffi)
    built = build_library(roots.flashinfer / VERSION_ARCH / "cached_ops" / "norm" / "norm.so")
    (built.parent / ".ninja_log").write_text("# ninja log v5\n")
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    for tree in jit_dirs.trees(mapped=[roots.tvm_ffi / TVM_DIR / f"{TVM_MODULE}.so", built]):
        caches.add_used(tree)
    caches.write_list()
    shutil.rmtree(roots.tvm_ffi)
    shutil.rmtree(roots.flashinfer)
    return archive, caches


def scheduler_runtime(archive: Path, mode: Mode, saved: bool = False) -> SimpleNamespace:
    return SimpleNamespace(session=SimpleNamespace(archive=archive, rank_dir=archive / "rank0"), mode=mode,
                           active=mode in (Mode.SAVE, Mode.LOAD), saved=saved, triton=None)


@pytest.fixture
def carriers(monkeypatch):
    """The Triton carriers the plugin installs (Triton itself is not needed here)."""
    installed: list[triton_cache.TritonCarrier] = []
    monkeypatch.setattr(triton_cache, "install", lambda carrier: installed.append(carrier) or True)
    jit_caches.reset()
    yield installed
    jit_caches.reset()


@needs_cc
def test_load_places_the_archives_jit_modules_on_a_thread_before_the_capture_phase(roots, tmp_path, carriers,
                                                                                 caplog):
    archive, caches = archive_with(tmp_path, roots)
    rt = scheduler_runtime(archive, Mode.LOAD)
    with caplog.at_level(logging.INFO, logger="foundry.sglang"):
        jit_caches.begin(rt)
        assert rt.triton is carriers[0] and carriers[0].source is not None  # Triton's kernels come per lookup
        jit_caches.placed()
    assert sglang_reuses(roots.tvm_ffi)
    assert (roots.flashinfer / VERSION_ARCH / "cached_ops/norm/norm.so").is_file()
    assert "JIT caches from the archive: 6 files" in caplog.text and "on a thread" in caplog.text
    assert "setting it up and waited" in caplog.text


@needs_cc
def test_a_corrupt_entry_is_refused_with_its_name_and_the_start_compiles_it(roots, tmp_path, carriers, caplog):
    archive, caches = archive_with(tmp_path, roots)
    entry = caches.entries["tvm_ffi"][f"{TVM_DIR}/{TVM_MODULE}.so"]
    blob = archive / "host_caches" / entry.sha256
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    blob.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="foundry"):
        jit_caches.begin(scheduler_runtime(archive, Mode.LOAD))
        jit_caches.placed()  # does not raise: the start goes on
    assert f"carried tvm_ffi file {TVM_DIR}/{TVM_MODULE}.so not used: its SHA-256 differs" in caplog.text
    assert not sglang_reuses(roots.tvm_ffi)  # SGLang builds this module, as without the archive
    assert not [p for p in roots.tvm_ffi.rglob("*") if p.is_file()]  # nothing of the unit, no temporary file
    assert (roots.flashinfer / VERSION_ARCH / "cached_ops/norm/norm.so").is_file()  # the intact module is placed


@needs_cc
def test_a_tampered_list_installs_nothing(roots, tmp_path, carriers, caplog):
    archive, _ = archive_with(tmp_path, roots)
    path = archive / "rank0" / "host_caches.json"
    listed = json.loads(path.read_text())
    files = listed["caches"]["tvm_ffi"]
    files["../../escaped.so"] = files.pop(f"{TVM_DIR}/{TVM_MODULE}.so")
    path.write_text(json.dumps(listed))
    rt = scheduler_runtime(archive, Mode.LOAD)
    with caplog.at_level(logging.WARNING, logger="foundry"):
        jit_caches.begin(rt)
        jit_caches.placed()
    assert "host caches are not used" in caplog.text and "not a relative path inside the archive" in caplog.text
    assert not roots.tvm_ffi.exists() and not roots.flashinfer.exists() and not (tmp_path / "escaped.so").exists()
    assert carriers[0].source is None  # Triton compiles what it lacks


@needs_cc
def test_save_carries_the_modules_the_start_loaded(roots, tmp_path, carriers, monkeypatch, caplog):
    monkeypatch.setenv(jit_caches.WATCH_ENV, "0")
    handle = load(tvm_ffi_build(roots.tvm_ffi))
    archive = tmp_path / "archive"
    rt = scheduler_runtime(archive, Mode.SAVE)
    jit_caches.begin(rt)
    assert rt.triton is carriers[0] and carriers[0].source is None
    assert jit_caches.carried(rt) is None  # nothing saved (SAVE failed): nothing carried
    rt.saved = True
    with caplog.at_level(logging.INFO, logger="foundry.sglang"):
        carry = jit_caches.carried(rt)
    assert carry is not None and carry.thread is None  # FOUNDRY_SGLANG_CACHE_WATCH=0: no watch
    assert f"{TVM_DIR}/{TVM_MODULE}.so" in HostCaches.read(archive, archive / "rank0").paths("tvm_ffi")
    assert "compile caches carried in the archive: 4 files" in caplog.text
    del handle


@needs_cc
def test_save_carries_tritons_module_built_at_import_for_the_fork_server(roots, tmp_path, carriers, monkeypatch):
    """Triton's cuda_utils, built and loaded at SGLang's import (before the scheduler's Triton
    carrier exists), is carried from the process's mapped files as foundry_core's
    triton_at_import names it."""
    from foundry_core.engine import triton_at_import

    monkeypatch.setenv(jit_caches.WATCH_ENV, "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    key = "cd" * 32
    handle = load(build_library(tmp_path / "triton" / key / "cuda_utils.cpython-312-x86_64-linux-gnu.so"))
    archive = tmp_path / "archive"
    rt = scheduler_runtime(archive, Mode.SAVE, saved=True)
    jit_caches.begin(rt)
    jit_caches.carried(rt)
    carried = HostCaches.read(archive, archive / "rank0").paths(triton_at_import.CACHE)
    assert carried == [f"{key}/cuda_utils.cpython-312-x86_64-linux-gnu.so"]
    del handle


def test_carrying_can_be_turned_off(tmp_path, carriers, monkeypatch):
    monkeypatch.setenv("FOUNDRY_HOST_CACHES", "0")
    rt = scheduler_runtime(tmp_path / "archive", Mode.SAVE, saved=True)
    jit_caches.begin(rt)
    assert carriers == [] and jit_caches.carried(rt) is None and not (tmp_path / "archive").exists()


def test_the_watch_length(monkeypatch, caplog):
    assert jit_caches.watch_seconds() == jit_caches.DEFAULT_WATCH_S
    monkeypatch.setenv(jit_caches.WATCH_ENV, "7.5")
    assert jit_caches.watch_seconds() == 7.5
    monkeypatch.setenv(jit_caches.WATCH_ENV, "soon")
    with caplog.at_level(logging.WARNING, logger="foundry.sglang"):
        assert jit_caches.watch_seconds() == jit_caches.DEFAULT_WATCH_S
    assert "FOUNDRY_SGLANG_CACHE_WATCH='soon' is not a number of seconds" in caplog.text


# ---- the carry's watch: what the first requests compile --------------------------------------------


def test_the_watch_carries_what_the_first_requests_add_once_it_is_complete(tmp_path, caplog):
    host = tmp_path / "cache"
    for name in ("a", "b"):
        (host / name).mkdir(parents=True)
        (host / name / "m.so").write_bytes(name.encode())
    used: list[str] = ["a"]
    triton = triton_cache.TritonCarrier()
    archive = tmp_path / "archive"
    carry = CacheCarry(HostCaches(archive, archive / "rank0"), triton,
                       lambda: [CacheTree("comp", host, tuple(used), mtimes=True)])
    assert carry.carry().files == 1
    assert carry.carry().files == 0  # nothing new: nothing added again
    with caplog.at_level(logging.INFO, logger="foundry"):
        carry.watch(seconds=1.0, poll=0.02, quiet=0.2)
        used.append("b")  # the server's warmup request loaded another module
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and "b/m.so" not in _listed(archive):
            time.sleep(0.02)
        carry.thread.join()
    assert _listed(archive) == {"a/m.so", "b/m.so"}
    # said when first seen, and again once carried
    assert "new compile-cache entries in use (0 Triton kernels, 1 other)" in caplog.text
    assert "compile caches of the first requests carried in the archive" in caplog.text


def _listed(archive: Path) -> set[str]:
    caches = HostCaches.read(archive, archive / "rank0")
    return set(caches.paths("comp")) if caches is not None else set()


def _kernel_dir(home: Path, key: str, complete: bool) -> str:
    # Triton writes a kernel's files, then its group file last.
    directory = home / key
    directory.mkdir(parents=True)
    (directory / "k.cubin").write_bytes(key.encode())
    if complete:
        (directory / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": str(directory / "k.cubin")}}))
    return str(directory)


def test_the_watch_carries_each_complete_kernel_at_once_while_others_keep_coming(tmp_path):
    home = tmp_path / "triton"
    triton = triton_cache.TritonCarrier(home=str(home))
    archive = tmp_path / "archive"
    carry = CacheCarry(HostCaches(archive, archive / "rank0"), triton, lambda: [])
    carry.watch(seconds=1.0, poll=0.02, quiet=10)  # never quiet: new kernels keep being looked up
    triton.used[_kernel_dir(home, "done", complete=True)] = "done"
    triton.used[_kernel_dir(home, "compiling", complete=False)] = "compiling"
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and not _listed_triton(archive):
        time.sleep(0.02)
    carry.stop()
    assert _listed_triton(archive) == {"done/k.cubin", "done/__grp__k.json"}


def test_an_incomplete_kernel_waits_until_nothing_new_appears(tmp_path):
    home = tmp_path / "triton"
    triton = triton_cache.TritonCarrier(home=str(home))
    triton.used[_kernel_dir(home, "compiling", complete=False)] = "compiling"
    archive = tmp_path / "archive"
    carry = CacheCarry(HostCaches(archive, archive / "rank0"), triton, lambda: [])
    carry.watch(seconds=0.3, poll=0.02, quiet=10)  # never quiet long enough within its time
    carry.thread.join()
    assert _listed_triton(archive) == set()
    carry.watch(seconds=1.0, poll=0.02, quiet=0.1)  # quiet: carried as far as it is written
    carry.thread.join()
    assert _listed_triton(archive) == {"compiling/k.cubin"}


def _carry_over_one_kernel(tmp_path: Path, key: str) -> tuple[str, triton_cache.TritonCarrier, Path, CacheCarry]:
    """Triton's directory with kernel ``key`` looked up and still being written, and a carry over it:
    (the kernel's directory, the carrier, the archive, the carry)."""
    home = tmp_path / "triton"
    triton = triton_cache.TritonCarrier(home=str(home))
    directory = _kernel_dir(home, key, complete=False)
    triton.used[directory] = key
    archive = tmp_path / "archive"
    return directory, triton, archive, CacheCarry(HostCaches(archive, archive / "rank0"), triton, lambda: [])


def test_a_kernel_completing_as_another_appears_is_not_quiet(tmp_path):
    first, triton, archive, carry = _carry_over_one_kernel(tmp_path, "first")
    began = time.monotonic()
    carry.watch(seconds=5.0, poll=0.02, quiet=2.0)
    time.sleep(1.2)
    Path(first, "__grp__k.json").write_text("{}")  # first completes as second is looked up
    triton.used[_kernel_dir(tmp_path / "triton", "second", complete=False)] = "second"
    assert _wait_listed(archive, {"first/k.cubin", "first/__grp__k.json"})
    # 2.6 s since first appeared, 1.4 s since second did: quiet by the count, not by the set
    time.sleep(max(0.0, began + 2.6 - time.monotonic()))
    listed = _listed_triton(archive)
    carry.stop()
    assert listed == {"first/k.cubin", "first/__grp__k.json"}


def test_a_kernel_carried_as_far_as_written_is_carried_again_once_complete(tmp_path):
    directory, _, archive, carry = _carry_over_one_kernel(tmp_path, "slow")
    carry.watch(seconds=5.0, poll=0.02, quiet=0.1)
    assert _wait_listed(archive, {"slow/k.cubin"})
    Path(directory, "__grp__k.json").write_text("{}")
    assert _wait_listed(archive, {"slow/k.cubin", "slow/__grp__k.json"})
    carry.stop()


def test_a_kernel_incomplete_at_the_first_carry_is_carried_again_by_the_watch(tmp_path):
    directory, _, archive, carry = _carry_over_one_kernel(tmp_path, "early")
    carry.carry()  # SAVE's carry after the start-up: the kernel is still being written
    assert _listed_triton(archive) == {"early/k.cubin"}
    carry.watch(seconds=5.0, poll=0.02, quiet=10)
    Path(directory, "__grp__k.json").write_text("{}")
    assert _wait_listed(archive, {"early/k.cubin", "early/__grp__k.json"})
    carry.stop()


def _wait_listed(archive: Path, want: set[str], seconds: float = 2.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _listed_triton(archive) == want:
            return True
        time.sleep(0.02)
    return False


def test_kernels_outside_tritons_directory_are_carried_as_elsewhere(tmp_path):
    home = tmp_path / "triton"
    triton = triton_cache.TritonCarrier(home=os.path.realpath(home))
    triton.used[_kernel_dir(home, "own", complete=True)] = "own"
    triton.used[_kernel_dir(tmp_path / "inductor" / "triton" / "0", "compiled", complete=True)] = "compiled"
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    carry = CacheCarry(caches, triton, lambda: [])
    done = carry.carry()
    assert done.files + done.present == 4  # the two group files, rewritten, are one blob
    assert set(caches.paths(triton_cache.CACHE)) == {"own/k.cubin", "own/__grp__k.json"}
    assert set(caches.paths(triton_cache.ELSEWHERE)) == {"compiled/k.cubin", "compiled/__grp__k.json"}


def test_a_part_carried_already_is_not_carried_again(tmp_path):
    home = tmp_path / "triton"
    triton = triton_cache.TritonCarrier(home=str(home))
    part = {_kernel_dir(home, "k1", complete=True): "k1"}
    triton.used.update(part)
    archive = tmp_path / "archive"
    carry = CacheCarry(HostCaches(archive, archive / "rank0"), triton, lambda: [])
    assert carry.carry(only=(part, [])).files == 2
    again = carry.carry(only=(part, []))
    assert (again.files, again.present) == (0, 0)


def _listed_triton(archive: Path) -> set[str]:
    caches = HostCaches.read(archive, archive / "rank0")
    return set(caches.paths(triton_cache.CACHE)) if caches is not None else set()


def test_caches_ahead_reports_a_unit_that_could_not_be_placed(tmp_path, caplog):
    source = HostCaches(tmp_path / "archive", tmp_path / "archive" / "rank0")
    source.entries = {"comp": {"d/f": Entry(1, "0" * 64)}}  # listed, never stored
    with caplog.at_level(logging.WARNING, logger="foundry"):
        done = CachesAhead(source, [CacheTree("comp", tmp_path / "host")]).start().wait()
    assert done.refused == 1 and "carried comp file d/f not used" in caplog.text


# ---- through SGLang's seams (the fake SGLang of test_sglang_plugin) ---------------------------------


@needs_cc
def test_a_scheduler_carries_at_save_and_places_at_load_before_its_capture_phase(scheduler, roots, carriers,
                                                                              monkeypatch):
    monkeypatch.setenv(jit_caches.WATCH_ENV, "0")
    handle = load(tvm_ffi_build(roots.tvm_ffi))  # a kernel SGLang built and loaded during the SAVE start
    save = scheduler("save")
    assert save.rt.saved and f"{TVM_DIR}/{TVM_MODULE}.so" in HostCaches.read(
        scheduler.archive, scheduler.archive / "rank0").paths("tvm_ffi")
    shutil.rmtree(roots.tvm_ffi)  # a new host

    seen_at_capture: list[bool] = []
    placed = jit_caches.placed
    monkeypatch.setattr(jit_caches, "placed", lambda: (placed(), seen_at_capture.append(sglang_reuses(roots.tvm_ffi))))
    load_run = scheduler("load")
    assert load_run.rt.restored == 4 and seen_at_capture == [True]
    del handle


def test_load_places_tritons_carried_kernels_ahead_where_triton_looks(tmp_path, monkeypatch):
    saved_host = tmp_path / "save-host-triton"
    key_dir = saved_host / "KEY"
    key_dir.mkdir(parents=True)
    (key_dir / "k.cubin").write_bytes(b"cubin")
    (key_dir / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": str(key_dir / "k.cubin")}}))
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    saving = triton_cache.TritonCarrier()
    saving.looked_up("KEY", str(key_dir))
    saving.carry(caches)
    caches.write_list()

    new_host = tmp_path / "new-host-triton"
    source = HostCaches.read(archive, archive / "rank0")
    carrier = triton_cache.TritonCarrier(source, home=str(new_host))  # Triton's directory, as install() reads it
    done = CachesAhead(source, [], triton=carrier).start().wait()
    assert done.files == 2 and (new_host / "KEY" / "k.cubin").read_bytes() == b"cubin"
    group = json.loads((new_host / "KEY" / "__grp__k.json").read_text())
    assert group["child_paths"]["k.cubin"] == str(new_host / "KEY" / "k.cubin")  # this host's path
    carrier.looked_up("KEY", str(new_host / "KEY"))  # Triton's own lookup later: nothing more to do
    assert carrier.seeded.files == 2


def _archive_with_kernels(tmp_path: Path, keys: tuple[str, ...]) -> HostCaches:
    saved_host = tmp_path / "save-host-triton"
    saving = triton_cache.TritonCarrier()
    for key in keys:
        (saved_host / key).mkdir(parents=True)
        (saved_host / key / "k.cubin").write_bytes(key.encode())
        saving.looked_up(key, str(saved_host / key))
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    saving.carry(caches)
    caches.write_list()
    return HostCaches.read(archive, archive / "rank0")


def test_the_thread_counts_only_the_kernels_it_placed(tmp_path):
    source = _archive_with_kernels(tmp_path, ("A", "B"))
    new_host = tmp_path / "new-host-triton"
    carrier = triton_cache.TritonCarrier(source, home=str(new_host))
    carrier.looked_up("A", str(new_host / "A"))  # the engine looked A up first, on its own path
    done = CachesAhead(source, [], triton=carrier).start().wait()
    assert (done.files, carrier.seeded.files) == (1, 2)  # the thread placed B alone


def test_a_failure_placing_kernels_ahead_is_said_and_the_lookups_go_on(tmp_path, monkeypatch, caplog):
    source = _archive_with_kernels(tmp_path, ("A",))
    carrier = triton_cache.TritonCarrier(source, home=str(tmp_path / "new-host-triton"))

    def broken(self, key, directory):
        raise RuntimeError("no such key")

    monkeypatch.setattr(triton_cache.TritonCarrier, "looked_up", broken)
    with caplog.at_level(logging.WARNING, logger="foundry"):
        CachesAhead(source, [], triton=carrier).start().wait()
    assert "Triton's carried kernels not all placed ahead (RuntimeError: no such key)" in caplog.text
