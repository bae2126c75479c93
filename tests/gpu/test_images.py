"""Kernel-image capture, mapping and reload on a real GPU (fresh processes under the preload)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from conftest import run_program

    directory = tmp_path_factory.mktemp("images")
    result = run_program("images_probe", "save", str(directory))
    (directory / "mapping.json").write_text(json.dumps(result["graph_kernels"]))
    print("\nimages captured:", result["images_seen"], "kernels in them:", result["kernels_seen"],
          "graph kernels:", len(result["graph_kernels"]), "images used:", len(result["used_images"]))
    return directory, result


def test_images_behind_cublas_aten_and_triton_are_captured(saved):
    _, r = saved
    names = [m["name"] for m in r["graph_kernels"]]
    assert r["finite"]
    assert any("nvjet" in n or "gemm" in n.lower() for n in names), names
    assert any(n.startswith("triton") for n in names), names
    assert any("at::native" in n or "at6native" in n for n in names), names
    assert "cubin" in r["image_kinds"] and "fatbin-wrapper" in r["image_kinds"], r["image_kinds"]


def test_every_graph_kernel_maps_to_an_image_and_name(saved):
    _, r = saved
    assert r["graph_kernels"]
    assert all(m["hash"] and m["name"] for m in r["graph_kernels"])


@pytest.mark.parametrize("how,threads", [("eager", None), ("lazy", None), ("lazy-resolve-first", None),
                                         ("eager", "4"), ("lazy", "1")])
def test_reloaded_images_resolve_every_kernel_and_dedupe_later_loads(saved, program, how, threads):
    import os

    directory, r = saved
    # FOUNDRY_IMAGE_THREADS: the driver loads on several threads, the lazy reads on one.
    env = dict(os.environ, FOUNDRY_IMAGE_THREADS=threads) if threads else None
    out = program("images_probe", "load", str(directory), str(directory / "mapping.json"), how, env=env)
    print("\nimages reloaded:", out["loaded"], "in", f"{out['load_seconds']:.4f} s,",
          "distinct kernels:", out["distinct_kernels"])
    assert out["loaded"] == len(r["used_images"])
    assert all(out["resolved"].values()), out["resolved"]
    assert out["entries_ok"]
    assert out["duplicates"] == [], "the application loaded a second copy of an archived image"
