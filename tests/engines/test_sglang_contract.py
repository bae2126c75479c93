"""Contract tests of sglang-foundry against SGLang, runnable on CI without a GPU.

(a) the plugin's ``sglang.srt.plugins`` entry point is registered by the installed
    ``sglang-foundry`` distribution (skipped when it is not installed: ``pip install -e
    plugins/sglang_foundry``);
(b) every seam of ``sglang_foundry/seams.py`` exists with the expected kind, parameters and body in
    the installed SGLang (marker ``engine``; skipped without SGLang);
(c) the same seams in the *source* of SGLang releases from PyPI (parsed with ``ast``, never
    imported): the pinned 0.5.17 (the release validated on the GPU machine) must have every seam;
    the newest release's table is printed, and the test fails only on seams the plugin cannot work
    without.

SGLang publishes no sdist, so (c) downloads one wheel (a zip; the Python sources are the same in
every platform's wheel) per release: the PyPI JSON index, then the wheel (0.5.17: 22 MB, 0.5.23:
39 MB), cached under ``~/.cache/foundry-tests/sglang/`` (``FOUNDRY_TEST_CACHE``) as ``sglang.json``,
the wheel, and ``src-<version>/`` holding the files the seams live in (extracted once; a fuller
tree already there is used as is, never deleted). A second run reads only the cache. Offline, (c)
is skipped with the reason (or uses the cached index and wheels); ``FOUNDRY_CONTRACT_DOWNLOAD=0``
skips it on purpose.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "sglang_foundry"
try:
    import sglang_foundry  # noqa: F401  (installed?)
except ImportError:  # not installed: the source tree still has the seams
    sys.path.insert(0, str(PLUGIN_DIR))

from sglang_foundry import contract, seams  # noqa: E402

PINNED = "0.5.17"
PYPI_JSON = "https://pypi.org/pypi/sglang/json"
DOWNLOAD_ENV = "FOUNDRY_CONTRACT_DOWNLOAD"
CACHE = Path(os.environ.get("FOUNDRY_TEST_CACHE", "~/.cache/foundry-tests")).expanduser() / "sglang"
INDEX_NAME = "sglang.json"
TIMEOUT = 60


# ---- (a) entry point ---------------------------------------------------------------------------


def test_entry_point_is_registered():
    try:
        dist = metadata.distribution("sglang-foundry")
    except metadata.PackageNotFoundError:
        pytest.skip("the sglang-foundry distribution is not installed (pip install -e plugins/sglang_foundry)")
    eps = [ep for ep in metadata.entry_points(group="sglang.srt.plugins") if ep.name == "foundry"]
    assert len(eps) == 1, f"expected one 'foundry' entry point in sglang.srt.plugins, found {eps}"
    ep = eps[0]
    assert ep.value == "sglang_foundry:register"
    assert ep.dist is None or ep.dist.name == dist.metadata["Name"]
    import sglang_foundry

    assert ep.load() is sglang_foundry.register
    assert seams.seam("plugins.group").value == ep.group
    assert "foundry-core" in " ".join(dist.requires or []), "sglang-foundry must depend on foundry-core"
    assert not any(r.startswith("sglang") and "extra ==" not in r for r in dist.requires or []), \
        "SGLang must stay an optional extra"


# ---- (b) installed SGLang -----------------------------------------------------------------------


@pytest.mark.engine
def test_seams_in_installed_sglang():
    version = contract.installed_version()
    if version is None:
        pytest.skip("SGLang is not installed")
    results = contract.check_installed()
    print("\n" + contract.format_table(results, version))
    failed = [r for r in results if not r.ok]
    assert not failed, "seams missing or changed in the installed SGLang " + version + ":\n" + "\n".join(
        f"  {r.seam.name}: {r.detail}" for r in failed)


# ---- (c) release sources from PyPI ----------------------------------------------------------------


def _download_allowed() -> None:
    if os.environ.get(DOWNLOAD_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        pytest.skip(f"{DOWNLOAD_ENV}=0: not downloading SGLang releases")


def _get(url: str):
    return urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "foundry-tests"}),
                                  timeout=TIMEOUT)


def _release_index() -> dict:
    """PyPI's JSON for sglang, cached for a day (the cached copy when PyPI is unreachable; skips
    when there is none)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = CACHE / INDEX_NAME
    if cached.is_file() and time.time() - cached.stat().st_mtime < 86400:
        return json.loads(cached.read_text())
    try:
        with _get(PYPI_JSON) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if cached.is_file():
            return json.loads(cached.read_text())
        pytest.skip(f"PyPI is unreachable ({exc}); cannot fetch SGLang release wheels")
    cached.write_text(json.dumps({"info": {"version": data["info"]["version"]}, "releases": data["releases"]}))
    return data


def _pick_wheel(index: dict, version: str) -> dict:
    """A wheel of ``version``: a pure one if there is one, else one already cached, else an x86_64
    one (their Python sources are identical)."""
    files = [f for f in index["releases"].get(version) or [] if f["filename"].endswith(".whl") and not f.get("yanked")]
    if not files:
        pytest.skip(f"SGLang {version} has no wheel on PyPI")

    def rank(f: dict) -> tuple:
        name = f["filename"]
        return (not name.endswith("-none-any.whl"), not (CACHE / name).is_file(), "x86_64" not in name, name)

    return sorted(files, key=rank)[0]


def _fetch(entry: dict) -> Path:
    """The wheel, downloaded once into the cache (sha256 checked)."""
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


def _extract(wheel: Path, version: str) -> Path:
    """Extracts the files the seams live in that ``src-<version>/`` lacks; returns that directory
    (which holds ``sglang/``). Files already there (a fuller unzipped tree) are kept."""
    root = CACHE / f"src-{version}"
    wanted = set(seams.source_files())
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(wanted & set(zf.namelist())):
            target = root / name
            if not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    return root


def _release_results(version: str | None) -> tuple[str, list[contract.SeamResult], float]:
    _download_allowed()
    start = time.perf_counter()
    index = _release_index()
    version = version or index["info"]["version"]
    if version not in index["releases"]:
        pytest.skip(f"SGLang {version} is not on PyPI")
    root = _extract(_fetch(_pick_wheel(index, version)), version)
    results = contract.check_sources(contract.directory_reader(root))
    return version, results, time.perf_counter() - start


def test_seams_in_pinned_release_source():
    version, results, seconds = _release_results(PINNED)
    print(f"\nSGLang {version} source fetched and checked in {seconds:.1f} s\n"
          + contract.format_table(results, version))
    failed = [r for r in results if not r.ok]
    assert not failed, f"seams missing or changed in SGLang {version}:\n" + "\n".join(
        f"  {r.seam.name} ({r.location}): {r.detail}" for r in failed)


def test_seams_in_newest_release_source():
    version, results, seconds = _release_results(None)
    print(f"\nnewest SGLang {version} source fetched and checked in {seconds:.1f} s\n"
          + contract.format_table(results, version))
    moved = [r for r in results if not r.ok]
    if moved:
        print("moved or changed in " + version + ": " + ", ".join(r.seam.name for r in moved))
    blocking = contract.blocking(results)
    assert not blocking, f"sglang-foundry cannot work with SGLang {version}; required seams moved:\n" + "\n".join(
        f"  {r.seam.name} ({r.seam.target}): {r.detail}" for r in blocking)


# ---- the checker itself (no download) --------------------------------------------------------------


def test_source_checker_reports_moved_and_changed(tmp_path):
    bootstrap = tmp_path / "sglang" / "srt" / "distributed" / "bootstrap.py"
    bootstrap.parent.mkdir(parents=True)
    bootstrap.write_text(
        "def _init_parallel_groups(*, backend, server_args):\n    init_distributed_environment()\n"
        "def init_torch_distributed(*, server_args):\n    _init_parallel_groups(backend='nccl', server_args=None)\n")
    backend = tmp_path / "sglang" / "srt" / "model_executor" / "runner_backend" / "full_cuda_graph_backend.py"
    backend.parent.mkdir(parents=True)
    backend.write_text(
        "class FullCudaGraphBackend:\n"
        "    def __init__(self, cuda_graph_runner):\n        self._graphs = {}\n        self._outputs = {}\n"
        "        self._device_module = None\n"
        "    def capture_one(self, shape_key, forward_fn):\n        graph = make_graph()\n"
        "        self._graphs[shape_key] = graph\n        self._outputs[shape_key] = forward_fn()\n"
        "    @staticmethod\n    def replay(shape_key):\n        pass\n")
    results = {r.seam.name: r for r in contract.check_sources(contract.directory_reader(tmp_path))}
    init = results["cg.backend_init"]
    assert init.ok and init.location.endswith("full_cuda_graph_backend.py:2")
    parallel = results["worker.parallel_groups"]
    assert parallel.status == contract.CHANGED
    assert "expected to start with (backend, dist_init_method" in parallel.detail
    assert "no longer calls initialize_model_parallel" in parallel.detail
    capture_one = results["cg.capture_one"]
    assert capture_one.status == contract.CHANGED and "torch.cuda.CUDAGraph" in capture_one.detail
    assert "is a staticmethod, expected a method" in results["cg.replay"].detail
    assert results["kv.resolve"].status == contract.MOVED and "not found" in results["kv.resolve"].detail
    table = contract.format_table(results.values(), "test").splitlines()
    assert table[0].split() == ["seam", "status", "sglang", "test", "detail"] and len(table) == len(seams.SEAMS) + 1
    blocking = contract.blocking(results.values())
    assert blocking and all(r.seam.required for r in blocking)
    assert "cli.add_cli_args" not in {r.seam.name for r in blocking}  # the environment still works without it
