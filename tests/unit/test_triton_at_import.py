"""foundry_core.engine.triton_at_import: Triton's modules an engine's imports build (SGLang's
``cuda_utils``), carried at SAVE from the files the process maps and placed at LOAD before the
imports, from the archive the main process names for its fork server."""

from __future__ import annotations

from pathlib import Path

import pytest

from foundry_core.engine import triton_at_import as tai
from foundry_core.engine.host_caches import HostCaches
from foundry_core.engine.layout import rank_dir

SUFFIX = ".cpython-312-x86_64-linux-gnu.so"
KEY = "9f3c" * 16  # Triton's keys are sha256 hex digests


def _triton_home(tmp_path: Path) -> Path:
    home = tmp_path / "triton-cache"
    (home / KEY).mkdir(parents=True)
    (home / KEY / f"cuda_utils{SUFFIX}").write_bytes(b"\x7fELF cuda_utils")
    (home / "KERNEL").mkdir()
    (home / "KERNEL" / "kernel.cubin").write_bytes(b"cubin")
    return home


def _saved_archive(tmp_path: Path, home: Path) -> Path:
    """An archive whose rank 0 carries what a SAVE carries of ``home`` (the mapped cuda_utils)."""
    archive = tmp_path / "archive"
    caches = HostCaches(archive, rank_dir(archive, 0))
    rank_dir(archive, 0).mkdir(parents=True)
    tree = tai.tree(home, mapped=[home / KEY / f"cuda_utils{SUFFIX}", Path("/usr/lib/libc.so.6")])
    caches.add_used(tree)
    caches.write_list()
    return archive


@pytest.mark.parametrize("env, expected", [
    ({"TRITON_CACHE_DIR": "/c", "TRITON_HOME": "/h"}, "/c"),
    ({"TRITON_HOME": "/h"}, "/h/.triton/cache"),
    ({"HOME": "/home/u"}, None),  # the user's home: Triton's own default
])
def test_the_cache_directory_is_tritons(env, expected, monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    found = tai.cache_dir(env)
    assert found == Path(expected if expected else "/home/u/.triton/cache")


def test_only_modules_in_key_directories_of_tritons_cache_are_named(tmp_path):
    home = _triton_home(tmp_path)
    (home / KEY / "deeper").mkdir()
    mapped = [home / KEY / f"cuda_utils{SUFFIX}", home / KEY / "deeper" / f"x{SUFFIX}",
              home / "KERNEL" / "kernel.cubin", tmp_path / f"elsewhere{SUFFIX}", home / f"top{SUFFIX}"]
    assert tai.loaded_keys(home, mapped) == (KEY,)
    # A module the worker's carrier looked up (a launcher it built) is the carrier's to carry.
    assert tai.loaded_keys(home, mapped, looked_up=[KEY]) == ()


def test_save_carries_the_mapped_module_and_load_places_it_where_the_host_lacks_it(tmp_path):
    home = _triton_home(tmp_path)
    archive = _saved_archive(tmp_path, home)
    listed = HostCaches.read(archive, rank_dir(archive, 0))
    assert listed.paths(tai.CACHE) == [f"{KEY}/cuda_utils{SUFFIX}"]  # not the kernel: the worker carries those

    new_host = tmp_path / "new-host-cache"
    done = tai.place(archive, new_host)
    assert (done.files, done.present) == (1, 0)
    assert (new_host / KEY / f"cuda_utils{SUFFIX}").read_bytes() == b"\x7fELF cuda_utils"
    again = tai.place(archive, new_host)
    assert (again.files, again.present) == (0, 1)


def test_a_hosts_own_module_is_never_replaced(tmp_path):
    archive = _saved_archive(tmp_path, _triton_home(tmp_path))
    host = tmp_path / "host"
    (host / KEY).mkdir(parents=True)
    (host / KEY / f"cuda_utils{SUFFIX}").write_bytes(b"the host's own")
    assert tai.place(archive, host).present == 1
    assert (host / KEY / f"cuda_utils{SUFFIX}").read_bytes() == b"the host's own"


def test_a_damaged_carried_module_is_not_placed(tmp_path):
    archive = _saved_archive(tmp_path, _triton_home(tmp_path))
    for blob in (archive / "host_caches").iterdir():
        blob.write_bytes(b"damaged")
    done = tai.place(archive, tmp_path / "host")
    assert (done.files, done.refused) == (0, 1)
    assert not (tmp_path / "host" / KEY / f"cuda_utils{SUFFIX}").exists()  # Triton builds it, as without the archive


def test_nothing_is_placed_without_carried_modules_or_with_carrying_off(tmp_path, monkeypatch):
    assert tai.place(tmp_path / "no-archive", tmp_path / "host") is None
    archive = _saved_archive(tmp_path, _triton_home(tmp_path))
    monkeypatch.setenv("FOUNDRY_HOST_CACHES", "0")
    assert tai.place(archive, tmp_path / "host") is None
    assert not (tmp_path / "host").exists()


@pytest.mark.parametrize("argv, env, expected", [
    (["-m", "sglang.launch_server", "--foundry-archive", "a"], {}, "a"),
    (["-m", "sglang.launch_server", "--foundry-archive=a", "--foundry-mode", "load"], {}, "a"),
    (["-m", "sglang.launch_server"], {"FOUNDRY_ARCHIVE": "a", "FOUNDRY_MODE": "AUTO"}, "a"),
    (["-m", "sglang.launch_server", "--foundry-archive", "a", "--foundry-mode", "save"], {}, None),
    (["-m", "sglang.launch_server", "--foundry-archive", "a"], {"FOUNDRY_MODE": "off"}, None),
    (["-m", "sglang.launch_server", "--foundry-mode", "load"], {}, None),
])
def test_the_fork_server_is_told_the_archive_of_a_load_or_an_auto_start(argv, env, expected, tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    told = tai.fork_server_environ(argv, env)
    assert told == ({tai.ARCHIVE_ENV: str(tmp_path / expected)} if expected else {})


def test_the_fork_servers_step_places_from_the_archive_it_was_told(tmp_path, monkeypatch):
    archive = _saved_archive(tmp_path, _triton_home(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "host"))
    assert tai.place_from_environ({}) == ""
    said = tai.place_from_environ({tai.ARCHIVE_ENV: str(archive)})
    assert said == "Triton's modules built at import, from the archive: 1 files (0.0 MiB) copied, 0 present"
    assert (tmp_path / "host" / KEY / f"cuda_utils{SUFFIX}").is_file()


def test_a_placement_that_fails_is_said_in_the_fork_servers_status(tmp_path, monkeypatch):
    from foundry_core.engine.fork_server import preload

    archive = _saved_archive(tmp_path, _triton_home(tmp_path))
    (tmp_path / "not-a-directory").write_text("a file where Triton's cache should be")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "not-a-directory"))
    monkeypatch.setenv(tai.ARCHIVE_ENV, str(archive))
    monkeypatch.setattr(preload, "unsafe_reason", lambda *a, **k: None)  # other tests' threads aside
    status = preload.run(modules=("json",), path=str(tmp_path / "status.json"), before=tai.place_from_environ)
    assert status["before"].startswith("the step before the imports failed (NotADirectoryError")
    assert status["safe"] is True  # the imports went on; Triton builds the module
