"""Contract tests of vllm-foundry against vLLM, runnable on CI without a GPU.

(a) the plugin's ``vllm.general_plugins`` entry point is registered by the installed
    ``vllm-foundry`` distribution (skipped when it is not installed: ``pip install -e
    plugins/vllm_foundry``);
(b) every seam of ``vllm_foundry/seams.py`` exists with the expected kind, parameters and body in
    the installed vLLM (marker ``engine``; skipped without vLLM);
(c) the same seams in the *source* of vLLM releases downloaded from PyPI (the sdist, parsed with
    ``ast``, never imported): the pinned 0.25.0 (the release validated on the GPU machine) must
    have every seam; the newest release's table is printed, and the test fails only on seams the
    plugin cannot work without.

Downloads: the PyPI JSON API, then one sdist per release (vLLM 0.25.0: 38 MB, 0.33.0: 47 MB),
cached under ``~/.cache/foundry-tests/`` (``FOUNDRY_TEST_CACHE``) with the few files the seams need
extracted beside it; a second run reads only those. Offline, (c) is skipped with the reason;
``FOUNDRY_CONTRACT_DOWNLOAD=0`` skips it on purpose.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "vllm_foundry"
try:
    import vllm_foundry  # noqa: F401  (installed?)
except ImportError:  # not installed: the source tree still has the seams
    sys.path.insert(0, str(PLUGIN_DIR))

from vllm_foundry import contract, seams  # noqa: E402

PINNED = "0.25.0"
PYPI_JSON = "https://pypi.org/pypi/vllm/json"
DOWNLOAD_ENV = "FOUNDRY_CONTRACT_DOWNLOAD"
CACHE = Path(os.environ.get("FOUNDRY_TEST_CACHE", "~/.cache/foundry-tests")).expanduser() / "vllm"
TIMEOUT = 60


# ---- (a) entry point ---------------------------------------------------------------------------


def test_entry_point_is_registered():
    try:
        dist = metadata.distribution("vllm-foundry")
    except metadata.PackageNotFoundError:
        pytest.skip("the vllm-foundry distribution is not installed (pip install -e plugins/vllm_foundry)")
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "foundry"]
    assert len(eps) == 1, f"expected one 'foundry' entry point in vllm.general_plugins, found {eps}"
    ep = eps[0]
    assert ep.value == "vllm_foundry:register"
    assert ep.dist is None or ep.dist.name == dist.metadata["Name"]
    import vllm_foundry

    assert ep.load() is vllm_foundry.register
    assert "foundry-core" in " ".join(dist.requires or []), "vllm-foundry must depend on foundry-core"
    assert not any(r.startswith("vllm") and "extra ==" not in r for r in dist.requires or []), \
        "vLLM must stay an optional extra"


# ---- (b) installed vLLM ------------------------------------------------------------------------


@pytest.mark.engine
def test_seams_in_installed_vllm():
    version = contract.installed_version()
    if version is None:
        pytest.skip("vLLM is not installed")
    results = contract.check_installed()
    print("\n" + contract.format_table(results, version))
    failed = [r for r in results if not r.ok]
    assert not failed, "seams missing or changed in the installed vLLM " + version + ":\n" + "\n".join(
        f"  {r.seam.name}: {r.detail}" for r in failed)


# ---- (c) release sources from PyPI ----------------------------------------------------------------


def _download_allowed() -> None:
    if os.environ.get(DOWNLOAD_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        pytest.skip(f"{DOWNLOAD_ENV}=0: not downloading vLLM releases")


def _get(url: str):
    return urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "foundry-tests"}),
                                  timeout=TIMEOUT)


def _release_index() -> dict:
    """PyPI's JSON for vllm, cached for a day (skips when offline)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = CACHE / "pypi.json"
    if cached.is_file() and time.time() - cached.stat().st_mtime < 86400:
        return json.loads(cached.read_text())
    try:
        with _get(PYPI_JSON) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if cached.is_file():
            return json.loads(cached.read_text())
        pytest.skip(f"PyPI is unreachable ({exc}); cannot fetch vLLM release sources")
    cached.write_text(json.dumps({"info": {"version": data["info"]["version"]}, "releases": data["releases"]}))
    return data


def _pick_file(index: dict, version: str) -> dict:
    files = index["releases"].get(version) or []
    sdists = [f for f in files if f.get("packagetype") == "sdist" and not f.get("yanked")]
    if sdists:
        return sdists[0]
    wheels = [f for f in files if f["filename"].endswith(".whl") and "x86_64" in f["filename"]]
    if not wheels:
        pytest.skip(f"vLLM {version} has neither an sdist nor an x86_64 wheel on PyPI")
    return wheels[0]


def _fetch(entry: dict) -> Path:
    """The release file, downloaded once into the cache (sha256 checked)."""
    dest = CACHE / entry["filename"]
    if dest.is_file():
        return dest
    url = urllib.parse.urljoin(PYPI_JSON, entry["url"])
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


def _extract(archive: Path, version: str) -> Path:
    """Extracts only the files the seams live in; returns a directory holding ``vllm/``."""
    root = CACHE / f"src-{version}"
    wanted = seams.source_files()
    stamp = root / ".files.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    targets = set(wanted)
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if name in targets:
                    (root / name).parent.mkdir(parents=True, exist_ok=True)
                    (root / name).write_bytes(zf.read(name))
    else:
        with tarfile.open(archive, "r:gz") as tf:
            for member in tf:
                rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
                if member.isfile() and rel in targets:
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / rel).write_bytes(tf.extractfile(member).read())  # type: ignore[union-attr]
    stamp.write_text(json.dumps(wanted))
    return root


def _release_results(version: str | None) -> tuple[str, list[contract.SeamResult], float]:
    _download_allowed()
    start = time.perf_counter()
    index = _release_index()
    version = version or index["info"]["version"]
    if version not in index["releases"]:
        pytest.skip(f"vLLM {version} is not on PyPI")
    root = _extract(_fetch(_pick_file(index, version)), version)
    results = contract.check_sources(contract.directory_reader(root))
    return version, results, time.perf_counter() - start


def test_seams_in_pinned_release_source():
    version, results, seconds = _release_results(PINNED)
    print(f"\nvLLM {version} source fetched and checked in {seconds:.1f} s\n" + contract.format_table(results, version))
    failed = [r for r in results if not r.ok]
    assert not failed, f"seams missing or changed in vLLM {version}:\n" + "\n".join(
        f"  {r.seam.name} ({r.location}): {r.detail}" for r in failed)


def test_seams_in_newest_release_source():
    version, results, seconds = _release_results(None)
    print(f"\nnewest vLLM {version} source fetched and checked in {seconds:.1f} s\n"
          + contract.format_table(results, version))
    moved = [r for r in results if not r.ok]
    if moved:
        print("moved or changed in " + version + ": " + ", ".join(r.seam.name for r in moved))
    blocking = contract.blocking(results)
    assert not blocking, f"vllm-foundry cannot work with vLLM {version}; required seams moved:\n" + "\n".join(
        f"  {r.seam.name} ({r.seam.target}): {r.detail}" for r in blocking)


# ---- the checker itself (no download) --------------------------------------------------------------


def test_source_checker_reports_moved_and_changed(tmp_path):
    worker = tmp_path / "vllm" / "v1" / "worker"
    worker.mkdir(parents=True)
    (worker / "gpu_worker.py").write_text(
        "from vllm.model_executor.warmup.kernel_warmup import kernel_warmup\n"
        "def init_worker_distributed_environment(config, rank):\n    pass\n"
        "class Worker:\n"
        "    def init_device(self):\n        init_worker_distributed_environment(None, 0)\n"
        "    @staticmethod\n    def determine_available_memory():\n        return 0\n"
        "    def compile_or_warm_up_model(self):\n        pass\n")
    results = {r.seam.name: r for r in contract.check_sources(contract.directory_reader(tmp_path))}
    assert results["worker.init_device"].ok and results["worker.init_device"].location.endswith("gpu_worker.py:5")
    assert results["worker.init_distributed"].status == contract.CHANGED
    assert "expected to start with (vllm_config, rank)" in results["worker.init_distributed"].detail
    assert "is a staticmethod, expected a method" in results["worker.determine_available_memory"].detail
    assert results["worker.initialize_from_config"].status == contract.MOVED
    assert "no longer calls kernel_warmup() by name" in results["worker.kernel_warmup"].detail
    assert results["cg.capture"].status == contract.MOVED and "not found" in results["cg.capture"].detail
    table = contract.format_table(results.values(), "test").splitlines()
    assert table[0].split() == ["seam", "status", "vllm", "test", "detail"] and len(table) == len(seams.SEAMS) + 1
    assert contract.blocking(results.values()) and all(r.seam.required for r in contract.blocking(results.values()))
