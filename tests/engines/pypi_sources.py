"""Engine releases from PyPI for the contract tests, test_vllm_contract.py and
test_sglang_contract.py (no tests here): the JSON index, cached for a day; one release file,
downloaded once with its sha256 checked; the few files the seams live in, extracted beside it.
Also the bodies of the tests both files hold under the same names (entry point, installed engine,
pinned and newest release), which differ only in the engine's names.

What differs per engine stays in its test file: which release file to take (vLLM publishes an
sdist, SGLang only wheels) and how its sources are extracted into the cache. The test files
register this module for pytest's assertion rewriting, so a failing check reports its values."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import tarfile
import time
import types
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

DOWNLOAD_ENV = "FOUNDRY_CONTRACT_DOWNLOAD"
CACHE_ROOT = Path(os.environ.get("FOUNDRY_TEST_CACHE", "~/.cache/foundry-tests")).expanduser()
TIMEOUT = 60
INDEX_MAX_AGE_S = 86400  # a day: a new release shows up the next day without a download per run


def cache_dir(package: str) -> Path:
    """Where one engine's index, release files and extracted sources are cached."""
    return CACHE_ROOT / package


def _get(url: str):
    return urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "foundry-tests"}),
                                  timeout=TIMEOUT)


def archive_members(archive: Path, names: Iterable[str]) -> Iterator[tuple[str, bytes]]:
    """The files of a wheel (a zip) or an sdist (a .tar.gz whose paths start with one top
    directory, dropped here) whose path is one of ``names``, with their bytes."""
    wanted = set(names)
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if name in wanted:
                    yield name, zf.read(name)
        return
    with tarfile.open(archive, "r:gz") as tf:
        for member in tf:
            rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if member.isfile() and rel in wanted:
                yield rel, tf.extractfile(member).read()  # type: ignore[union-attr]


def extract_files(archive: Path, root: Path, names: Iterable[str]) -> None:
    """Writes the files of ``archive`` named in ``names`` under ``root`` (the checker reads only
    those: a release's whole tree is hundreds of megabytes)."""
    for name, data in archive_members(archive, names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


@dataclasses.dataclass(frozen=True)
class EngineReleases:
    """One engine's plugin, its contract module and its releases on PyPI.

    ``name`` is the engine as messages spell it ("vLLM"); ``package`` the PyPI project and import
    name ("vllm"); ``index_name`` the cached index's file name; ``artifacts`` what (c) downloads,
    for the offline skip ("release sources"); ``pick(index, version)`` the release file's index
    entry; ``extract(archive, version)`` the directory holding the extracted sources."""

    name: str
    package: str
    index_name: str
    artifacts: str
    contract: types.ModuleType
    pick: Callable[[dict, str], dict]
    extract: Callable[[Path, str], Path]

    @property
    def cache(self) -> Path:
        return cache_dir(self.package)

    @property
    def index_url(self) -> str:
        return f"https://pypi.org/pypi/{self.package}/json"

    @property
    def plugin(self) -> str:
        """The plugin's distribution name ("vllm-foundry")."""
        return f"{self.package}-foundry"

    # ---- PyPI ---------------------------------------------------------------------------------

    def download_allowed(self) -> None:
        """Skips the test when FOUNDRY_CONTRACT_DOWNLOAD turns downloads off."""
        if os.environ.get(DOWNLOAD_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            pytest.skip(f"{DOWNLOAD_ENV}=0: not downloading {self.name} releases")

    def release_index(self) -> dict:
        """PyPI's JSON for the engine, cached for a day (the cached copy when PyPI is unreachable;
        skips when there is none)."""
        self.cache.mkdir(parents=True, exist_ok=True)
        cached = self.cache / self.index_name
        if cached.is_file() and time.time() - cached.stat().st_mtime < INDEX_MAX_AGE_S:
            return json.loads(cached.read_text())
        try:
            with _get(self.index_url) as resp:
                data = json.load(resp)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if cached.is_file():
                return json.loads(cached.read_text())
            pytest.skip(f"PyPI is unreachable ({exc}); cannot fetch {self.name} {self.artifacts}")
        cached.write_text(json.dumps({"info": {"version": data["info"]["version"]}, "releases": data["releases"]}))
        return data

    def fetch(self, entry: dict) -> Path:
        """The release file, downloaded once into the cache (sha256 checked)."""
        dest = self.cache / entry["filename"]
        if dest.is_file():
            return dest
        url = urllib.parse.urljoin(self.index_url, entry["url"])
        tmp = dest.with_suffix(dest.suffix + f".part{os.getpid()}")
        digest = hashlib.sha256()
        try:
            with _get(url) as resp, open(tmp, "wb") as out:
                while chunk := resp.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as exc:
            tmp.unlink(missing_ok=True)
            pytest.skip(f"cannot download {url} ({exc})")
        expected = entry.get("digests", {}).get("sha256")
        if expected and digest.hexdigest() != expected:
            tmp.unlink(missing_ok=True)
            raise AssertionError(f"{entry['filename']}: sha256 {digest.hexdigest()} differs from PyPI's {expected}")
        os.replace(tmp, dest)
        return dest

    def release_results(self, version: str | None) -> tuple[str, list[Any], float]:
        """The seams checked in the source of ``version`` (the newest when None): the version, the
        results and the seconds it took (downloads included)."""
        self.download_allowed()
        start = time.perf_counter()
        index = self.release_index()
        version = version or index["info"]["version"]
        if version not in index["releases"]:
            pytest.skip(f"{self.name} {version} is not on PyPI")
        root = self.extract(self.fetch(self.pick(index, version)), version)
        results = self.contract.check_sources(self.contract.directory_reader(root))
        return version, results, time.perf_counter() - start

    # ---- checks both engines pass ---------------------------------------------------------------

    def check_entry_point(self, group: str) -> metadata.EntryPoint:
        """The installed plugin registers its ``register`` function (``<plugin>.register:register``,
        or ``<plugin>:register``) as entry point 'foundry' of ``group``, depends on foundry-core and
        keeps the engine an optional extra; returns it."""
        module = self.plugin.replace("-", "_")
        try:
            dist = metadata.distribution(self.plugin)
        except metadata.PackageNotFoundError:
            pytest.skip(f"the {self.plugin} distribution is not installed (pip install -e plugins/{module})")
        eps = [ep for ep in metadata.entry_points(group=group) if ep.name == "foundry"]
        assert len(eps) == 1, f"expected one 'foundry' entry point in {group}, found {eps}"
        ep = eps[0]
        assert ep.value in (f"{module}.register:register", f"{module}:register"), ep.value
        assert ep.dist is None or ep.dist.name == dist.metadata["Name"]
        assert ep.load() is importlib.import_module(f"{module}.register").register
        assert "foundry-core" in " ".join(dist.requires or []), f"{self.plugin} must depend on foundry-core"
        assert not any(r.startswith(self.package) and "extra ==" not in r for r in dist.requires or []), \
            f"{self.name} must stay an optional extra"
        return ep

    def check_installed(self) -> None:
        """Every seam exists with the expected shape in the installed engine (skips without one)."""
        version = self.contract.installed_version()
        if version is None:
            pytest.skip(f"{self.name} is not installed")
        results = self.contract.check_installed()
        print("\n" + self.contract.format_table(results, version))
        failed = [r for r in results if not r.ok]
        assert not failed, f"seams missing or changed in the installed {self.name} " + version + ":\n" + "\n".join(
            f"  {r.seam.name}: {r.detail}" for r in failed)

    def check_pinned_release(self, version: str) -> None:
        """Every seam is in the source of the release validated on the GPU machine."""
        version, results, seconds = self.release_results(version)
        print(f"\n{self.name} {version} source fetched and checked in {seconds:.1f} s\n"
              + self.contract.format_table(results, version))
        failed = [r for r in results if not r.ok]
        assert not failed, f"seams missing or changed in {self.name} {version}:\n" + "\n".join(
            f"  {r.seam.name} ({r.location}): {r.detail}" for r in failed)

    def check_newest_release(self) -> None:
        """The newest release's table is printed; only seams the plugin cannot work without fail."""
        version, results, seconds = self.release_results(None)
        print(f"\nnewest {self.name} {version} source fetched and checked in {seconds:.1f} s\n"
              + self.contract.format_table(results, version))
        moved = [r for r in results if not r.ok]
        if moved:
            print("moved or changed in " + version + ": " + ", ".join(r.seam.name for r in moved))
        blocking = self.contract.blocking(results)
        assert not blocking, f"{self.plugin} cannot work with {self.name} {version}; required seams moved:\n" + \
            "\n".join(f"  {r.seam.name} ({r.seam.target}): {r.detail}" for r in blocking)
