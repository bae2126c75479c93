"""A kernel's cache preference (cuFuncSetCacheConfig) is archived at SAVE and set again on the
restored kernel in a fresh process (CUfunc_cache: 1 prefer shared, 2 prefer L1)."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu

PREFER_NONE, PREFER_SHARED, PREFER_L1 = 0, 1, 2


def test_restored_kernels_get_the_captured_cache_preference(program, tmp_path):
    env = dict(os.environ, FOUNDRY_TEST_TMP=str(tmp_path))
    saved = program("cache_config_probe", "save", str(tmp_path), env=env)
    if "skip" in saved:
        pytest.skip(saved["skip"])
    kernels = {k["name"]: k for k in saved["kernels"]}
    print(f"\nTriton {saved['triton']}, kernels at SAVE: {kernels}")
    matmul, scale = kernels["matmul_kernel"], kernels["scale_kernel"]
    # Triton set PREFER_SHARED itself (the matmul needs more than 48 KiB of shared memory), the
    # program set PREFER_L1 through libcuda; the preload saw both calls, and the archive holds both.
    assert matmul["shared"] > 48 * 1024, matmul
    if saved["oversized_shared_mode"]:
        # A Triton and driver that use the oversized shared-memory mode set no cache preference.
        print("Triton set CU_FUNC_ATTRIBUTE_SHARED_MEMORY_MODE instead of a cache preference")
        assert (matmul["seen"], matmul["archived"]) == (PREFER_NONE, PREFER_NONE), matmul
    else:
        assert (matmul["seen"], matmul["archived"]) == (PREFER_SHARED, PREFER_SHARED), matmul
    assert (scale["seen"], scale["archived"]) == (PREFER_L1, PREFER_L1), scale
    others = [k for name, k in kernels.items() if name not in ("matmul_kernel", "scale_kernel")]
    assert others and all(k["archived"] == PREFER_NONE for k in others), others

    (tmp_path / "kernels.json").write_text(json.dumps(saved["kernels"]))
    loaded = program("cache_config_probe", "load", str(tmp_path), str(tmp_path / "kernels.json"), env=env)
    print(f"kernels at LOAD: {loaded['kernels']}")
    assert loaded["digest"] == saved["digest"]
    for name, k in kernels.items():
        restored = loaded["kernels"][name]
        assert restored["in_graph"], f"{name}: the restored graph does not run the archive's copy"
        assert restored["config"] == k["archived"], (name, restored, k)
