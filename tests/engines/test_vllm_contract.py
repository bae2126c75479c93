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

import json
import shutil
import sys
from pathlib import Path

import pytest


from pypi_sources import EngineReleases, cache_dir, extract_files  # noqa: E402

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "vllm_foundry"
try:
    import vllm_foundry  # noqa: F401  (installed?)
except ImportError:  # not installed: the source tree still has the seams
    sys.path.insert(0, str(PLUGIN_DIR))

from vllm_foundry import contract, seams  # noqa: E402

PINNED = "0.25.0"
CACHE = cache_dir("vllm")


def _pick_file(index: dict, version: str) -> dict:
    """The sdist of ``version``, else an x86_64 wheel."""
    files = index["releases"].get(version) or []
    sdists = [f for f in files if f.get("packagetype") == "sdist" and not f.get("yanked")]
    if sdists:
        return sdists[0]
    wheels = [f for f in files if f["filename"].endswith(".whl") and "x86_64" in f["filename"]]
    if not wheels:
        pytest.skip(f"vLLM {version} has neither an sdist nor an x86_64 wheel on PyPI")
    return wheels[0]


def _extract(archive: Path, version: str) -> Path:
    """Extracts only the files the seams live in; returns a directory holding ``vllm/``."""
    root = CACHE / f"src-{version}"
    wanted = seams.source_files()
    stamp = root / ".files.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    extract_files(archive, root, wanted)
    stamp.write_text(json.dumps(wanted))
    return root


RELEASES = EngineReleases("vLLM", "vllm", "pypi.json", "release sources", contract, _pick_file, _extract)


# ---- (a) entry point ---------------------------------------------------------------------------


def test_entry_point_is_registered():
    RELEASES.check_entry_point("vllm.general_plugins")


# ---- (b) installed vLLM ------------------------------------------------------------------------


@pytest.mark.engine
def test_seams_in_installed_vllm():
    RELEASES.check_installed()


# ---- (c) release sources from PyPI ----------------------------------------------------------------


def test_seams_in_pinned_release_source():
    RELEASES.check_pinned_release(PINNED)


def test_seams_in_newest_release_source():
    RELEASES.check_newest_release()


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
