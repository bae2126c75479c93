"""foundry_core.engine.mode: parsing, flag/env/default precedence, AUTO resolution against archives."""

from __future__ import annotations

import json

import pytest

from test_engine_support import write_rank_archive

from foundry_core.engine.mode import Mode, check_complete, is_complete, parse_mode, resolve_mode, resolve_settings
from foundry_core.errors import FormatError, InvalidArgumentError, NotFoundError, VersionError


@pytest.mark.parametrize("text,mode", [("auto", Mode.AUTO), ("SAVE", Mode.SAVE), (" load ", Mode.LOAD),
                                       ("Off", Mode.OFF), (Mode.LOAD, Mode.LOAD)])
def test_parse_mode_accepts_choices(text, mode):
    assert parse_mode(text) is mode


@pytest.mark.parametrize("text", ["restore", "", "1", None, 3])
def test_parse_mode_error_lists_the_choices(text):
    with pytest.raises(InvalidArgumentError) as info:
        parse_mode(text)
    assert "auto, save, load, off" in str(info.value)


# ---- precedence: flag > environment > default ----------------------------------------------

@pytest.mark.parametrize("flag_mode,env_mode,flag_archive,env_archive,expected", [
    (None, None, None, None, (Mode.OFF, None, "default", "default")),
    (None, None, None, "/a/env", (Mode.AUTO, "/a/env", "default", "environment")),
    (None, None, "/a/flag", "/a/env", (Mode.AUTO, "/a/flag", "default", "flag")),
    (None, "load", None, "/a/env", (Mode.LOAD, "/a/env", "environment", "environment")),
    ("save", "load", "/a/flag", None, (Mode.SAVE, "/a/flag", "flag", "flag")),
    ("off", "load", "/a/flag", None, (Mode.OFF, "/a/flag", "flag", "flag")),
    (Mode.LOAD, "save", None, "/a/env", (Mode.LOAD, "/a/env", "flag", "environment")),
    ("", "save", "", "/a/env", (Mode.SAVE, "/a/env", "environment", "environment")),  # empty flag = unset
    (None, "  ", None, " ", (Mode.OFF, None, "default", "default")),                  # blank env = unset
    ("auto", None, None, None, (Mode.OFF, None, "flag", "default")),                  # auto, no archive: off
])
def test_settings_precedence(flag_mode, env_mode, flag_archive, env_archive, expected):
    env = {}
    if env_mode is not None:
        env["FOUNDRY_MODE"] = env_mode
    if env_archive is not None:
        env["FOUNDRY_ARCHIVE"] = env_archive
    s = resolve_settings(flag_mode, flag_archive, environ=env)
    mode, archive, mode_source, archive_source = expected
    assert s.mode is mode
    assert (str(s.archive) if s.archive else None) == archive
    assert (s.mode_source, s.archive_source) == (mode_source, archive_source)


def test_settings_read_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("FOUNDRY_MODE", "save")
    monkeypatch.setenv("FOUNDRY_ARCHIVE", "/x")
    assert resolve_settings().mode is Mode.SAVE


@pytest.mark.parametrize("mode", ["save", "load"])
def test_explicit_mode_without_archive_says_how_to_give_one(mode):
    with pytest.raises(InvalidArgumentError) as info:
        resolve_settings(mode, None, environ={})
    assert "--foundry-archive" in str(info.value) and "FOUNDRY_ARCHIVE" in str(info.value)


def test_bad_environment_mode_names_the_variable():
    with pytest.raises(InvalidArgumentError) as info:
        resolve_settings(None, "/a", environ={"FOUNDRY_MODE": "restore"})
    assert "FOUNDRY_MODE" in str(info.value) and "auto, save, load, off" in str(info.value)


def test_bad_flag_mode_names_the_flag():
    with pytest.raises(InvalidArgumentError, match="--foundry-mode"):
        resolve_settings("nope", "/a", environ={})


# ---- resolution against the archive ----------------------------------------------------------

def _corrupt_manifest(d):
    (d / "manifest.json").write_text("{not json")


def _wrong_manifest_version(d):
    doc = json.loads((d / "manifest.json").read_text())
    doc["version"] = 999
    (d / "manifest.json").write_text(json.dumps(doc))


def _missing_field(d):
    doc = json.loads((d / "manifest.json").read_text())
    del doc["graphs"]
    (d / "manifest.json").write_text(json.dumps(doc))


DAMAGE = {
    "manifest corrupt": (_corrupt_manifest, "not valid JSON"),
    "manifest field missing": (_missing_field, "'graphs'"),
    "manifest missing": (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
    "payload missing": (lambda d: (d / "graphs.fgr").unlink(), "graphs.fgr is missing"),
    "images missing": (lambda d: (d / "images").rmdir(), "images/ directory is missing"),
    "state missing": (lambda d: (d / "engine_state.json").unlink(), "engine_state.json is missing"),
    "state corrupt": (lambda d: (d / "engine_state.json").write_text("[]"), "not a JSON object"),
}


@pytest.fixture
def rank0(tmp_path):
    return write_rank_archive(tmp_path / "archive" / "rank0")


def test_auto_without_archive_saves(tmp_path):
    assert resolve_mode("auto", tmp_path / "archive" / "rank0") is Mode.SAVE


def test_auto_with_complete_archive_loads(rank0):
    assert is_complete(rank0)
    check_complete(rank0)
    assert resolve_mode(Mode.AUTO, rank0) is Mode.LOAD


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_auto_with_damaged_archive_saves(rank0, damage):
    DAMAGE[damage][0](rank0)
    assert not is_complete(rank0)
    assert resolve_mode("auto", rank0) is Mode.SAVE


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_explicit_load_of_damaged_archive_names_the_cause(rank0, damage):
    action, expected = DAMAGE[damage]
    action(rank0)
    with pytest.raises(FormatError) as info:
        resolve_mode("load", rank0)
    assert expected in str(info.value)
    assert str(rank0) in str(info.value)


def test_explicit_load_of_newer_format_is_a_version_error(rank0):
    _wrong_manifest_version(rank0)
    with pytest.raises(VersionError):
        resolve_mode("load", rank0)
    assert resolve_mode("auto", rank0) is Mode.SAVE


def test_explicit_load_without_archive(tmp_path):
    with pytest.raises(NotFoundError, match="no archive at"):
        resolve_mode("load", tmp_path / "rank0")


def test_rank_path_that_is_a_file_is_not_an_archive(tmp_path):
    (tmp_path / "rank0").write_text("x")
    with pytest.raises(FormatError, match="not an archive directory"):
        check_complete(tmp_path / "rank0")


@pytest.mark.parametrize("requested,expected", [("save", Mode.SAVE), ("off", Mode.OFF)])
def test_save_and_off_ignore_the_archive(rank0, requested, expected):
    assert resolve_mode(requested, rank0) is expected


def test_no_archive_directory():
    assert resolve_mode("auto", None) is Mode.OFF
    assert resolve_mode("off", None) is Mode.OFF
    with pytest.raises(InvalidArgumentError, match="needs an archive"):
        resolve_mode("load", None)
