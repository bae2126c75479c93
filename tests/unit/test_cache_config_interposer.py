"""The preload sees cache preferences set with cuFuncSetCacheConfig, with no GPU: a stub
libcuda.so.1 stands in for the driver.

The driver has no getter for a function's cache preference, so SAVE knows one only by watching
the calls (csrc/intercept/function_handlers.cpp). Two callers are checked, as on a GPU machine:
a program linked against libcuda (Triton's launcher calls cuFuncSetCacheConfig that way) and a
ctypes lookup (dlsym). Each call must reach the stub driver, be recorded for
foundry_function_cache_config, and be forgotten when the function's module is unloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from foundry_core.preload import preload_environment

ROOT = Path(__file__).resolve().parents[2]
MODULE = 0xABC0  # the stub's cuFuncGetModule answer for every function


def cuda_include() -> Path | None:
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "include" / "cuda.h").is_file():
            return Path(base) / "include"
    return None


def toolchain_missing() -> str | None:
    if shutil.which("cc") is None:
        return "no C compiler on this machine"
    if cuda_include() is None:
        return "cuda.h not found (set CUDA_HOME)"
    return None


needs_toolchain = pytest.mark.skipif(toolchain_missing() is not None, reason=str(toolchain_missing()))


def driver_symbols() -> list[str]:
    """Every libcuda symbol Foundry resolves (its X-macro table, expanded through cuda.h as the
    library itself expands it: cuMemAlloc -> cuMemAlloc_v2)."""
    probe = '#include "driver/driver.h"\n#define FOUNDRY_SYM(name) @@name@@\nFOUNDRY_DRIVER_FUNCTIONS(FOUNDRY_SYM)\n'
    out = subprocess.run(["cc", "-x", "c++", "-E", "-P", f"-I{ROOT / 'csrc'}", f"-I{cuda_include()}", "-"],
                         input=probe, capture_output=True, text=True, check=True).stdout
    return sorted(set(re.findall(r"@@\s*(\w+)\s*@@", out)))


STUB_SPECIAL = r"""
#include <stdint.h>
static int last_config = -1;
int cuFuncSetCacheConfig(void* f, int config) { last_config = config; return 0; }
int cuKernelSetCacheConfig(void* k, int config, int dev) { last_config = config; return 0; }
int cuFuncGetModule(void** module, void* f) { *module = (void*)0xABC0; return 0; }
int stub_last_config(void) { return last_config; }
"""

CALLER = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
int cuFuncSetCacheConfig(void* f, int config);
int cuModuleUnload(void* module);
int stub_last_config(void);
int main(void) {
  int (*get)(uint64_t, int32_t*) = (int (*)(uint64_t, int32_t*))dlsym(RTLD_DEFAULT, "foundry_function_cache_config");
  if (get == NULL) return 2;
  int32_t seen = -1, after_unload = -1;
  if (cuFuncSetCacheConfig((void*)0x1234, 1) != 0) return 3;
  get(0x1234, &seen);
  int driver = stub_last_config();
  cuModuleUnload((void*)0xABC0);
  get(0x1234, &after_unload);
  printf("%d %d %d\n", driver, seen, after_unload);
  return 0;
}
"""

CTYPES = r"""
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuFuncSetCacheConfig.argtypes = [ctypes.c_void_p, ctypes.c_int]
assert cuda.cuFuncSetCacheConfig(ctypes.c_void_p(0x5678), 2) == 0
from foundry_core.images import function_cache_config
print(cuda.stub_last_config(), function_cache_config(0x5678), function_cache_config(0x9999))
"""


@pytest.fixture(scope="module")
def stub_driver(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("stub-cuda")
    special = {"cuFuncSetCacheConfig", "cuKernelSetCacheConfig", "cuFuncGetModule"}
    stubs = "".join(f"int {name}(void) {{ return 0; }}\n" for name in driver_symbols() if name not in special)
    (d / "stub.c").write_text(STUB_SPECIAL + stubs)
    subprocess.run(["cc", "-shared", "-fPIC", str(d / "stub.c"), "-o", str(d / "libcuda.so.1"),
                    "-Wl,-soname,libcuda.so.1"], check=True)
    return d


def stub_environment(stub: Path) -> dict[str, str]:
    env = preload_environment()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(stub), env.get("LD_LIBRARY_PATH")]))
    return env


def test_a_function_without_a_recorded_preference_has_the_default():
    from foundry_core.images import function_cache_config

    assert function_cache_config(0x1234) == 0  # no call was seen for this handle: PREFER_NONE


@needs_toolchain
def test_the_stub_covers_the_new_entry_points():
    names = driver_symbols()
    assert "cuFuncSetCacheConfig" in names and "cuKernelSetCacheConfig" in names
    assert "cuMemAlloc_v2" in names  # expanded as libfoundry expands it


@needs_toolchain
def test_a_program_linked_against_libcuda_is_seen_setting_a_preference(stub_driver, tmp_path):
    (tmp_path / "caller.c").write_text(CALLER)
    exe = tmp_path / "caller"
    subprocess.run(["cc", str(tmp_path / "caller.c"), "-o", str(exe), f"-L{stub_driver}", "-l:libcuda.so.1",
                    f"-Wl,-rpath,{stub_driver}", "-ldl"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, env=stub_environment(stub_driver), timeout=60)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    driver, seen, after_unload = map(int, out.stdout.split())
    assert driver == 1, "the call did not reach the driver"
    assert seen == 1, "the preload did not record the preference"
    assert after_unload == 0, "the preference outlived its module"


@needs_toolchain
def test_a_ctypes_lookup_is_seen_setting_a_preference(stub_driver):
    out = subprocess.run([sys.executable, "-c", CTYPES], capture_output=True, text=True,
                         env=stub_environment(stub_driver), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["2", "2", "0"]
