"""Contract tests of trtllm-foundry against TensorRT-LLM, runnable on CI without a GPU.

(a) the installed ``trtllm-foundry`` distribution ships the start-up hook (``trtllm-foundry.pth``
    and ``_trtllm_foundry_hook`` at the top of a site directory), depends on foundry-core and
    keeps TensorRT-LLM an optional extra (skipped when it is not installed: ``pip install -e
    plugins/trtllm_foundry``);
(b) every seam of ``trtllm_foundry/seams.py`` exists with the expected kind, parameters and body in
    the installed TensorRT-LLM (marker ``engine``). Skipped unless ``import tensorrt_llm`` works:
    PyPI's ``tensorrt-llm`` is a stub sdist that downloads the real wheel from NVIDIA's own index at
    install time, which neither CI nor the GPU machine can reach;
(c) the same seams in the *source* of the release tag v1.2.1 on GitHub (parsed with ``ast``, never
    imported): only the files the seams live in are fetched, once, into
    ``~/.cache/foundry-tests/tensorrt_llm/src-1.2.1/`` (``FOUNDRY_TEST_CACHE``); a second run reads
    only the cache. Offline, (c) is skipped with the reason; ``FOUNDRY_CONTRACT_DOWNLOAD=0`` skips
    it on purpose. No PyPI file is read: there is no TensorRT-LLM source on PyPI.

The synthetic TensorRT-LLM the unit tests drive is checked against the same table in
tests/unit/test_trtllm_fake.py.
"""

from __future__ import annotations

import importlib
import os
import sys
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path

import pytest

from pypi_sources import DOWNLOAD_ENV, TIMEOUT, cache_dir  # noqa: E402

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "trtllm_foundry"
try:
    import trtllm_foundry  # noqa: F401  (installed?)
except ImportError:  # not installed: the source tree still has the seams
    sys.path.insert(0, str(PLUGIN_DIR))

from trtllm_foundry import contract, seams  # noqa: E402

TAG = "v1.2.1"
RAW = "https://raw.githubusercontent.com/NVIDIA/TensorRT-LLM/{tag}/{path}"
MISSING = ".missing"  # a cached 404: the file is not in that release
STUB_REASON = ("TensorRT-LLM is not importable here: PyPI's tensorrt-llm is a stub that downloads the real wheel "
               "from NVIDIA's own index at install time, which neither CI nor the GPU machine can reach")


# ---- (a) the distribution -------------------------------------------------------------------------


def test_distribution_ships_the_start_up_hook():
    try:
        dist = metadata.distribution("trtllm-foundry")
    except metadata.PackageNotFoundError:
        pytest.skip("the trtllm-foundry distribution is not installed (pip install -e plugins/trtllm_foundry)")
    files = {str(f) for f in dist.files or []}
    assert "trtllm-foundry.pth" in files and "_trtllm_foundry_hook.py" in files, sorted(files)[:20]
    pth = Path(dist.locate_file("trtllm-foundry.pth"))
    assert pth.read_text().strip() == "import _trtllm_foundry_hook; _trtllm_foundry_hook.start()"
    assert (pth.parent / "_trtllm_foundry_hook.py").is_file()
    requires = dist.requires or []
    assert any(r.startswith("foundry-core") for r in requires), requires
    assert not any(r.startswith("tensorrt-llm") and "extra ==" not in r for r in requires), \
        "TensorRT-LLM must stay an optional extra"


# ---- (b) installed TensorRT-LLM --------------------------------------------------------------------


@pytest.mark.engine
def test_seams_in_installed_tensorrt_llm():
    try:
        importlib.import_module("tensorrt_llm")
    except Exception as exc:  # noqa: BLE001 - the stub, missing libraries, no GPU driver
        pytest.skip(f"{STUB_REASON} ({type(exc).__name__}: {exc})")
    version = contract.installed_version() or "unknown"
    results = contract.check_installed()
    print("\n" + contract.format_table(results, version))
    failed = [f"  {r.seam.name}: {r.detail}" for r in results if not r.ok]
    assert not failed, f"seams missing or changed in the installed TensorRT-LLM {version}:\n" + "\n".join(failed)


# ---- (c) the v1.2.1 source on GitHub ----------------------------------------------------------------


def github_reader(tag: str) -> contract.Reader:
    """A Reader over the files of ``tag`` on GitHub, each fetched once into the cache (a 404 is
    cached as missing). Skips the test when GitHub cannot be reached."""
    root = cache_dir("tensorrt_llm") / f"src-{tag.lstrip('v')}"

    def read(path: str) -> str | None:
        local = root / path
        if local.is_file():
            return local.read_text()
        if (root / (path + MISSING)).is_file():
            return None
        url = RAW.format(tag=tag, path=path)
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "foundry-tests"}),
                                        timeout=TIMEOUT) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                pytest.skip(f"GitHub answered {exc.code} for {url}")
            (root / (path + MISSING)).parent.mkdir(parents=True, exist_ok=True)
            (root / (path + MISSING)).write_text("")
            return None
        except (urllib.error.URLError, OSError) as exc:
            pytest.skip(f"GitHub is unreachable ({exc}); cannot read TensorRT-LLM {tag}'s source")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text)
        return text

    return read


def test_seams_in_the_release_source():
    if os.environ.get(DOWNLOAD_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        pytest.skip(f"{DOWNLOAD_ENV}=0: not downloading TensorRT-LLM {TAG}'s source")
    results = contract.check_sources(github_reader(TAG))
    print(f"\nTensorRT-LLM {TAG} source (GitHub)\n" + contract.format_table(results, TAG))
    failed = [f"  {r.seam.name} ({r.location}): {r.detail}" for r in results if not r.ok]
    assert not failed, f"seams missing or changed in TensorRT-LLM {TAG}:\n" + "\n".join(failed)


def test_every_seam_says_where_it_was_read():
    assert set(seams.READ_FROM) == set(seams.BY_NAME)
    # Messages say what the seams were checked against: not the tag, until the check above has run.
    assert all(TAG.lstrip("v") not in v or "not yet checked" in v for v in seams.TESTED_VERSIONS)
