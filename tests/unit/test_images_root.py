"""Where LOAD finds a directory's kernel images: an archive's images/, or the hook_archive/ of
graphs saved one by one (the layout scripts written for the original Foundry load from)."""

from __future__ import annotations

import os

import pytest

from foundry_core.images import SINGLE_GRAPH_IMAGES, images_root


def _images(root) -> None:
    (root / "images").mkdir(parents=True)
    (root / "images" / "0123456789abcdef.fimg").write_bytes(b"x")


def test_an_archive_directory_holds_its_own_images(tmp_path):
    _images(tmp_path)
    assert images_root(tmp_path) == os.fspath(tmp_path)


def test_graphs_saved_one_by_one_keep_their_images_in_hook_archive(tmp_path):
    (tmp_path / "graph.json").write_text("{}")
    _images(tmp_path / SINGLE_GRAPH_IMAGES)
    assert images_root(tmp_path) == os.fspath(tmp_path / "hook_archive")
    # The original Foundry's LOAD script names hook_archive itself.
    assert images_root(tmp_path / "hook_archive") == os.fspath(tmp_path / "hook_archive")


def test_an_archive_images_directory_wins_over_a_hook_archive_beside_it(tmp_path):
    _images(tmp_path)
    _images(tmp_path / SINGLE_GRAPH_IMAGES)
    assert images_root(tmp_path) == os.fspath(tmp_path)


def test_a_symlinked_images_directory_is_not_looked_past(tmp_path):
    # The loader refuses a symlinked images/ (an archive's images are plain files); resolution
    # must leave it in place for that check rather than fall back to hook_archive/.
    _images(tmp_path / "elsewhere")
    (tmp_path / "images").symlink_to(tmp_path / "elsewhere" / "images")
    _images(tmp_path / SINGLE_GRAPH_IMAGES)
    assert images_root(tmp_path) == os.fspath(tmp_path)


@pytest.mark.parametrize("layout", ["empty", "hook_archive without images"])
def test_a_directory_without_images_is_returned_as_given(tmp_path, layout):
    if layout != "empty":
        (tmp_path / SINGLE_GRAPH_IMAGES).mkdir()
    assert images_root(tmp_path) == os.fspath(tmp_path)
