"""Does the driver load kernel images faster on several threads?

LOAD hands every archived image to the driver (``cuModuleLoadData``) and asks it for the kernels
the graphs launch (``cuModuleGetFunction``, which is where a lazily loading driver does the work).
That costs about 1 ms per image, serially. This probe, which needs no Foundry and no torch, builds
one cubin of KERNELS distinct kernels with nvcc, then loads COPIES copies of it (each load is a
separate module to the driver) on 1, 2, 4 and 8 threads and prints the wall time per image for
each, once with CUDA_MODULE_LOADING=EAGER and once with LAZY (each in its own process, since the
driver reads the variable at cuInit).

    python scripts/image_load_probe.py [--kernels 100] [--copies 64] [--arch sm_90]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time


def kernel_source(kernels: int) -> str:
    """KERNELS kernels with different bodies, so each has its own machine code."""
    body = []
    for i in range(kernels):
        body.append(
            f'extern "C" __global__ void k{i}(float* x, int n) {{\n'
            f"  int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"  if (t < n) {{ float v = x[t]; for (int j = 0; j < {4 + i % 13}; ++j) v = v * 1.0001f + {i}.0f; x[t] = v; }}\n"
            f"}}\n")
    return "".join(body)


def build_cubin(kernels: int, arch: str, directory: str) -> str:
    src = os.path.join(directory, "probe.cu")
    out = os.path.join(directory, "probe.cubin")
    with open(src, "w") as f:
        f.write(kernel_source(kernels))
    subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-O3", "-o", out, src], check=True)
    return out


class Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")

    @staticmethod
    def check(result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed: CUresult {result}")

    def load(self, image: bytes, names: list[bytes]) -> ctypes.c_void_p:
        """One module of ``image`` and a handle to each named kernel."""
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
        func = ctypes.c_void_p()
        for name in names:
            self.check(self.lib.cuModuleGetFunction(ctypes.byref(func), module, name), "cuModuleGetFunction")
        return module


def timed_loads(driver: Driver, image: bytes, names: list[bytes], copies: int, threads: int) -> float:
    """Seconds to load ``copies`` modules spread over ``threads`` threads (ctypes drops the GIL
    for each driver call), every kernel of each resolved; the modules are unloaded afterwards."""
    modules: list[ctypes.c_void_p] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(count: int) -> None:
        try:
            driver.check(driver.lib.cuCtxSetCurrent(driver.ctx), "cuCtxSetCurrent")
            mine = [driver.load(image, names) for _ in range(count)]
            with lock:
                modules.extend(mine)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    shares = [copies // threads + (1 if i < copies % threads else 0) for i in range(threads)]
    workers = [threading.Thread(target=work, args=(n,)) for n in shares]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    for m in modules:
        driver.check(driver.lib.cuModuleUnload(m), "cuModuleUnload")
    return elapsed


def measure(cubin: str, kernels: int, copies: int) -> dict:
    driver = Driver()
    driver.check(driver.lib.cuCtxSetCurrent(driver.ctx), "cuCtxSetCurrent")
    with open(cubin, "rb") as f:
        image = f.read()
    names = [f"k{i}".encode() for i in range(kernels)]
    timed_loads(driver, image, names, 4, 1)  # the driver's first module loads are dearer
    return {str(t): timed_loads(driver, image, names, copies, t) for t in (1, 2, 4, 8)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=100)
    ap.add_argument("--copies", type=int, default=64)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # child: measure this cubin, print JSON
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.kernels, args.copies)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        cubin = build_cubin(args.kernels, args.arch, tmp)
        print(f"cubin: {args.kernels} kernels, {os.path.getsize(cubin) / 1024:.0f} KiB; {args.copies} copies loaded, "
              f"every kernel resolved")
        print("| CUDA_MODULE_LOADING | threads | wall ms | ms per image | speed-up |")
        print("|---|---|---|---|---|")
        for mode in ("EAGER", "LAZY"):
            env = dict(os.environ, CUDA_MODULE_LOADING=mode)
            out = subprocess.run([sys.executable, __file__, "--measure", cubin, "--kernels", str(args.kernels),
                                  "--copies", str(args.copies)], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"the {mode} measurement failed:\n{out.stderr.strip()}", file=sys.stderr)
                return 1
            walls = json.loads(out.stdout.strip().splitlines()[-1])
            for t, wall in walls.items():
                print(f"| {mode} | {t} | {wall * 1e3:.1f} | {wall * 1e3 / args.copies:.2f} | {walls['1'] / wall:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
