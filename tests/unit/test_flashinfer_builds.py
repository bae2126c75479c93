"""FlashInfer modules carried from a host whose FlashInfer cache was at another path
(foundry_core.engine.flashinfer_builds): placed at this host's path and loaded as built, without
ninja, only while the library is the archive's byte for byte and its sources are not newer; any
other module, or the same path, goes through FlashInfer's own build. The module is a real
FlashInfer-style ninja build (test_sglang_jit_caches); FlashInfer's loader is a stand-in with
the attributes 0.6.15's ``JitSpec`` has."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from foundry_core.engine import flashinfer_builds, jit_dirs
from foundry_core.engine.host_caches import HostCaches
from foundry_core.engine.mode import Mode

from sglang_foundry import jit_caches
from test_sglang_jit_caches import (  # noqa: F401 - its fixtures
    OLD, VERSION_ARCH, carriers, flashinfer_module, needs_ninja, roots, scheduler_runtime,
)


def fake_flashinfer(saved_root: Path | None = None) -> SimpleNamespace:
    """``flashinfer.jit.core`` as far as the wrapper uses it: ``JitSpec`` (name, is_aot,
    jit_library_path, lock_path, ninja_path, write_ninja, load, build_and_load) and ``FileLock``.
    ``write_ninja`` writes what FlashInfer would for this host: the saving host's build.ninja of
    the module at this root (``saved_root``), plus ``extra`` (another flag on this host)."""
    calls: list[tuple[str, str]] = []
    core = SimpleNamespace(calls=calls, extra="", load_error=None)

    @contextlib.contextmanager
    def file_lock(path, thread_local=True):
        calls.append(("lock", str(path)))
        try:
            yield
        finally:
            calls.append(("unlock", str(path)))

    class JitSpec:
        def __init__(self, name: str, root: Path, version_arch: str = VERSION_ARCH) -> None:
            self.name, self.is_aot, self.root = name, False, root
            self.build_dir = root / version_arch / "cached_ops" / name
            self.jit_library_path = self.build_dir / f"{name}.so"
            self.lock_path = self.build_dir / f"{name}.lock"
            self.ninja_path = self.build_dir / "build.ninja"

        def write_ninja(self):
            saved = (saved_root / VERSION_ARCH / "cached_ops" / self.name / "build.ninja").read_text()
            self.ninja_path.write_text(saved.replace(f"{os.path.realpath(saved_root)}/",
                                                     f"{os.path.realpath(self.root)}/") + core.extra)

        def load(self, path):
            calls.append(("load", str(path)))
            if core.load_error is not None:
                raise core.load_error
            return "module"

        def build_and_load(self):
            calls.append(("build", self.name))
            return "module"

    core.JitSpec, core.FileLock = JitSpec, file_lock
    return core


def saved_archive(roots, tmp_path: Path) -> Path:
    """SAVE of one FlashInfer-style module built by ninja at the saving host's cache."""
    module = flashinfer_module(roots.flashinfer, tmp_path / "site-packages" / "flashinfer")
    archive = tmp_path / "archive"
    caches = HostCaches(archive, archive / "rank0")
    caches.add_used(jit_dirs.flashinfer_tree(mapped=[module / "norm.so"]))
    caches.write_list()
    return archive


def placed_elsewhere(archive: Path, tmp_path: Path, core) -> tuple[Path, HostCaches]:
    """LOAD on a host whose FlashInfer cache is at another path: the tree relocated and placed."""
    root = tmp_path / "other-base" / ".cache" / "flashinfer"
    source = HostCaches.read(archive, archive / "rank0")
    tree = flashinfer_builds.relocate(jit_dirs.flashinfer_tree(root=root), source, core)
    assert tree.relocatable
    done = source.restore(tree)
    assert done.files > 0 and done.refused == 0
    return root, source


@pytest.fixture
def relocated(roots, tmp_path) -> SimpleNamespace:
    """A SAVE's module placed on a host whose FlashInfer cache is elsewhere, the loader wrapped."""
    core = fake_flashinfer(roots.flashinfer)
    root, source = placed_elsewhere(saved_archive(roots, tmp_path), tmp_path, core)
    return SimpleNamespace(core=core, root=root, source=source,
                           library=root / VERSION_ARCH / "cached_ops" / "norm" / "norm.so")


@needs_ninja
def test_a_module_from_another_cache_path_is_loaded_as_built_without_ninja(roots, relocated, caplog):
    core, root, library = relocated.core, relocated.root, relocated.library
    assert library.read_bytes() == (roots.flashinfer / VERSION_ARCH / "cached_ops" / "norm" / "norm.so").read_bytes()
    with caplog.at_level(logging.INFO, logger="foundry"):
        assert core.JitSpec("norm", root).build_and_load() == "module"
    lock = str(library.parent / "norm.lock")
    assert core.calls == [("lock", lock), ("load", str(library)), ("unlock", lock)]  # loaded under the lock
    assert "FlashInfer's norm module taken from the archive as built, without ninja" in caplog.text


@needs_ninja
def test_a_changed_library_a_newer_source_or_another_module_goes_through_flashinfers_build(relocated, tmp_path,
                                                                                           caplog):
    core, root, library = relocated.core, relocated.root, relocated.library

    assert core.JitSpec("sampling", root).build_and_load() == "module"  # not carried
    assert core.calls == [("build", "sampling")]

    source = tmp_path / "site-packages" / "flashinfer" / "norm.c"
    newer = library.stat().st_mtime_ns + 1_000_000_000
    os.utime(source, ns=(newer, newer))  # FlashInfer upgraded in place: ninja would rebuild
    core.calls.clear()
    with caplog.at_level(logging.INFO, logger="foundry"):
        core.JitSpec("norm", root).build_and_load()
    assert ("build", "norm") in core.calls and not [c for c in core.calls if c[0] == "load"]
    assert f"{source} is missing or newer than the archive's build" in caplog.text
    os.utime(source, ns=(OLD, OLD))

    core.extra = "cflags = -O0\n"  # this host would build it with another flag (or toolkit, or sources)
    core.calls.clear()
    with caplog.at_level(logging.INFO, logger="foundry"):
        core.JitSpec("norm", root).build_and_load()
    assert ("build", "norm") in core.calls and not [c for c in core.calls if c[0] == "load"]
    assert "this host builds it with other commands or sources" in caplog.text
    core.extra = ""

    core.calls.clear()
    elsewhere = "9.9.9/100a"  # the same name and bytes at another version's place: not the carried one
    (root / elsewhere / "cached_ops" / "norm").mkdir(parents=True)
    (root / elsewhere / "cached_ops" / "norm" / "norm.so").write_bytes(library.read_bytes())
    core.JitSpec("norm", root, elsewhere).build_and_load()
    assert ("build", "norm") in core.calls and not [c for c in core.calls if c[0] == "load"]

    core.load_error = OSError("undefined symbol")  # the library does not load here: FlashInfer builds it
    core.calls.clear()
    with caplog.at_level(logging.INFO, logger="foundry"):
        assert core.JitSpec("norm", root).build_and_load() == "module"
    assert [c[0] for c in core.calls] == ["lock", "load", "unlock", "build"]
    assert "taking the archive's failed: OSError: undefined symbol" in caplog.text
    core.load_error = None

    data = bytearray(library.read_bytes())
    data[-1] ^= 0xFF  # the host's own build, or a damaged one: not the archive's bytes
    library.write_bytes(bytes(data))
    core.calls.clear()
    core.JitSpec("norm", root).build_and_load()
    assert ("build", "norm") in core.calls and not [c for c in core.calls if c[0] == "load"]


@needs_ninja
def test_at_the_saving_hosts_path_ninja_decides_and_nothing_is_wrapped(roots, tmp_path):
    archive = saved_archive(roots, tmp_path)
    core = fake_flashinfer(roots.flashinfer)
    original = core.JitSpec.build_and_load
    source = HostCaches.read(archive, archive / "rank0")
    tree = jit_dirs.flashinfer_tree(root=roots.flashinfer)
    assert flashinfer_builds.relocate(tree, source, core) is tree
    assert core.JitSpec.build_and_load is original


@needs_ninja
def test_without_flashinfers_loader_the_modules_stay_unplaced_and_a_warning_says_why(roots, tmp_path, caplog):
    archive = saved_archive(roots, tmp_path)
    source = HostCaches.read(archive, archive / "rank0")
    root = tmp_path / "other-base" / ".cache" / "flashinfer"
    tree = flashinfer_builds.relocate(jit_dirs.flashinfer_tree(root=root), source, SimpleNamespace())
    assert not tree.relocatable
    with caplog.at_level(logging.WARNING, logger="foundry"):
        assert source.restore(tree).files == 0
    assert not root.exists() and "flashinfer files are not placed: they were built in" in caplog.text


@needs_ninja
def test_installing_again_replaces_the_builds_without_wrapping_twice(relocated, tmp_path):
    core, root = relocated.core, relocated.root
    wrapped = core.JitSpec.build_and_load
    empty = flashinfer_builds.CarriedBuilds(HostCaches(tmp_path / "none", tmp_path / "none" / "rank0"), "/x", root)
    assert flashinfer_builds.install(empty, core) and core.JitSpec.build_and_load is wrapped
    core.JitSpec("norm", root).build_and_load()
    assert core.calls == [("build", "norm")]  # the new builds carry no norm module


@needs_ninja
def test_the_sglang_scheduler_places_and_loads_a_module_from_another_cache_path(roots, tmp_path, carriers,
                                                                              monkeypatch, caplog):
    archive = saved_archive(roots, tmp_path)
    root = tmp_path / "new-home" / ".cache" / "flashinfer"
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "new-home"))
    core = fake_flashinfer(roots.flashinfer)
    monkeypatch.setitem(sys.modules, flashinfer_builds.CORE_MODULE, core)
    with caplog.at_level(logging.INFO, logger="foundry"):
        jit_caches.begin(scheduler_runtime(archive, Mode.LOAD))
        jit_caches.placed()
        core.JitSpec("norm", root).build_and_load()
    assert (root / VERSION_ARCH / "cached_ops" / "norm" / "norm.so").is_file()
    assert [c[0] for c in core.calls] == ["lock", "load", "unlock"]
    assert "flashinfer files are not placed" not in caplog.text


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
