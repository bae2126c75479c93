"""Which commit a time-to-ready result names: the checkout's, or an exported tree's own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from foundry_core.ready import facts

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _exported(into: Path, commit_text: str) -> Path:
    package = into / "tree" / "foundry_core"
    package.mkdir(parents=True)
    (package / facts.COMMIT_FILE).write_text(commit_text + "\n")
    return package


def test_a_checkout_names_its_head():
    if not (ROOT / ".git").exists():
        pytest.skip("not running from a git checkout")
    assert facts.git_commit(ROOT / "foundry_core").split("+")[0] == _git("rev-parse", "HEAD", cwd=ROOT)


def test_an_exported_tree_inside_another_repository_names_its_own_commit(tmp_path):
    _git("init", "-q", cwd=tmp_path)  # the enclosing repository, whose HEAD is not the tree's
    package = _exported(tmp_path, "0123456789abcdef0123456789abcdef01234567")
    assert facts.git_commit(package) == "0123456789abcdef0123456789abcdef01234567"


def test_a_tree_whose_commit_was_never_written_names_none(tmp_path):
    assert facts.git_commit(_exported(tmp_path, "$Format:%H$")) is None


def test_the_archive_writes_the_commit(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not running from a git checkout")
    archive = subprocess.run(["git", "archive", "HEAD", "foundry_core/COMMIT", ".gitattributes"], cwd=ROOT,
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    assert (tmp_path / "foundry_core" / "COMMIT").read_text().strip() == _git("rev-parse", "HEAD", cwd=ROOT)
