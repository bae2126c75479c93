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

import sys
from pathlib import Path

import pytest


from pypi_sources import EngineReleases, cache_dir, extract_files  # noqa: E402

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "sglang_foundry"
try:
    import sglang_foundry  # noqa: F401  (installed?)
except ImportError:  # not installed: the source tree still has the seams
    sys.path.insert(0, str(PLUGIN_DIR))

from sglang_foundry import contract, seams  # noqa: E402

PINNED = "0.5.17"
CACHE = cache_dir("sglang")


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


def _extract(wheel: Path, version: str) -> Path:
    """Extracts the files the seams live in that ``src-<version>/`` lacks; returns that directory
    (which holds ``sglang/``). Files already there (a fuller unzipped tree) are kept."""
    root = CACHE / f"src-{version}"
    extract_files(wheel, root, [name for name in seams.source_files() if not (root / name).is_file()])
    return root


RELEASES = EngineReleases("SGLang", "sglang", "sglang.json", "release wheels", contract, _pick_wheel, _extract)


# ---- (a) entry point ---------------------------------------------------------------------------


def test_entry_point_is_registered():
    ep = RELEASES.check_entry_point("sglang.srt.plugins")
    assert seams.seam("plugins.group").value == ep.group


# ---- (b) installed SGLang -----------------------------------------------------------------------


@pytest.mark.engine
def test_seams_in_installed_sglang():
    RELEASES.check_installed()


# ---- (c) release sources from PyPI ----------------------------------------------------------------


def test_seams_in_pinned_release_source():
    RELEASES.check_pinned_release(PINNED)


def test_seams_in_newest_release_source():
    RELEASES.check_newest_release()


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
