"""Kernel-image parsing through the C API, on images nvcc builds during the test (no GPU needed).

Covers foundry_image_inspect, foundry_fatbin_extract_cubin and foundry_hash64 against what nvcc
writes: plain fatbins for several architectures, a cubin, PTX, and the __fatBinC_Wrapper_t
structures of a real two-translation-unit -rdc shared library (version 2 for the device-link
stub, version 1 per translation unit), found through its .nvFatBinSegment section after dlopen.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

xxhash = pytest.importorskip("xxhash", reason="the xxhash package is the XXH64 reference (pip install xxhash)")


def _find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


NVCC = _find_nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, CUDA_HOME, /usr/local/cuda): "
                                "these tests compile CUDA images to parse")

FOUNDRY_OK = 0
FOUNDRY_ERR_INVALID_ARGUMENT = 1
FOUNDRY_ERR_FORMAT = 10
KIND_WRAPPER, KIND_FATBIN, KIND_CUBIN, KIND_PTX = 1, 2, 3, 4
WRAPPER_MAGIC = 0x466243B1
FATBIN_MAGIC = 0xBA55ED50

KERNELS_CU = r"""
__device__ __noinline__ float twice(float v) { return 2.0f * v; }
__global__ void scale_kernel(float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
extern "C" __global__ void apply_twice(float* x) { x[threadIdx.x] = twice(x[threadIdx.x]); }
"""
KERNEL_NAMES = {"_Z12scale_kernelPffi", "apply_twice"}

RDC_A_CU = r"""
extern __device__ float shared_twice(float);
__global__ void kernel_a(float* x) { x[0] = shared_twice(x[0]); }
extern "C" void launch_a(float* x) { kernel_a<<<1, 1>>>(x); }
"""
RDC_B_CU = r"""
__device__ float shared_twice(float v) { return 2.0f * v; }
__global__ void kernel_b(float* x) { x[1] = shared_twice(x[1]); }
extern "C" void launch_b(float* x) { kernel_b<<<1, 1>>>(x); }
"""
RDC_ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]


# ---- helpers ---------------------------------------------------------------------------------


def _nvcc(*args: str, cwd: Path) -> None:
    proc = subprocess.run([NVCC, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"nvcc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")


def _elf_sections(data: bytes) -> list[tuple]:
    """(name, type, addr, offset, size, link, entsize) of each section of a 64-bit LE ELF."""
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, shstrndx = struct.unpack_from("<HH", data, 60)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
    names_off = raw[shstrndx][4]

    def name(off: int) -> str:
        end = data.index(b"\0", names_off + off)
        return data[names_off + off:end].decode()

    return [(name(r[0]), r[1], r[3], r[4], r[5], r[6], r[9]) for r in raw]


def _elf_kernel_names(data: bytes) -> set[str]:
    """An independent reading of the cubin's entry symbols (STT_FUNC, defined, STO_CUDA_ENTRY)."""
    sections = _elf_sections(data)
    names = set()
    for _, typ, _, off, size, link, entsize in sections:
        if typ != 2:  # SHT_SYMTAB
            continue
        str_off = sections[link][3]
        for i in range(1, size // entsize):
            st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", data, off + i * entsize)
            if st_info & 0xF == 2 and st_shndx != 0 and st_other & 0x10:
                end = data.index(b"\0", str_off + st_name)
                names.add(data[str_off + st_name:end].decode())
    return names


def _container_size(address: int) -> int:
    magic, _version, header_size, payload_size = struct.unpack("<IHHQ", ctypes.string_at(address, 16))
    assert magic == FATBIN_MAGIC
    return header_size + payload_size


class _Wrapper(ctypes.Structure):
    _fields_ = [("magic", ctypes.c_int), ("version", ctypes.c_int), ("data", ctypes.c_void_p),
                ("filename_or_fatbins", ctypes.c_void_p)]


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


# ---- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lib():
    from foundry_core import _library

    lib = _library.load()
    lib.foundry_last_error.restype = ctypes.c_char_p
    lib.foundry_image_inspect.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint32),
                                          ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)]
    lib.foundry_image_inspect.restype = ctypes.c_int
    lib.foundry_fatbin_extract_cubin.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p,
                                                 ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]
    lib.foundry_fatbin_extract_cubin.restype = ctypes.c_int
    lib.foundry_hash64.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
    lib.foundry_hash64.restype = ctypes.c_uint64
    return lib


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, bytes]:
    work = tmp_path_factory.mktemp("images")
    (work / "kernels.cu").write_text(KERNELS_CU)
    _nvcc("kernels.cu", "--fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
          "-gencode", "arch=compute_90,code=compute_90", "-o", "multi.fatbin", cwd=work)
    _nvcc("kernels.cu", "--fatbin", "--no-compress", "-gencode", "arch=compute_90,code=sm_90",
          "-gencode", "arch=compute_90,code=compute_90", "-o", "plain.fatbin", cwd=work)
    _nvcc("kernels.cu", "--fatbin", "-Xfatbin", "-compress-all", "-gencode", "arch=compute_90,code=sm_90",
          "-o", "compressed.fatbin", cwd=work)
    _nvcc("kernels.cu", "-cubin", "-arch=sm_90", "-o", "sm90.cubin", cwd=work)
    _nvcc("kernels.cu", "-ptx", "-arch=compute_90", "-o", "kernels.ptx", cwd=work)
    return {p.name: p.read_bytes() for p in work.iterdir() if p.suffix in (".fatbin", ".cubin", ".ptx")}


@pytest.fixture(scope="module")
def rdc_library(tmp_path_factory):
    """A shared library linked from two -rdc translation units, loaded into this process."""
    work = tmp_path_factory.mktemp("rdc")
    (work / "a.cu").write_text(RDC_A_CU)
    (work / "b.cu").write_text(RDC_B_CU)
    _nvcc("-rdc=true", "-Xcompiler", "-fPIC", *RDC_ARCHS, "-c", "a.cu", "b.cu", cwd=work)
    _nvcc("-shared", "-Xcompiler", "-fPIC", *RDC_ARCHS, "-o", "librdc.so", "a.o", "b.o", cwd=work)
    path = work / "librdc.so"
    handle = ctypes.CDLL(str(path))
    info = _DlInfo()
    libc = ctypes.CDLL(None)
    assert libc.dladdr(ctypes.cast(handle.launch_a, ctypes.c_void_p), ctypes.byref(info)) != 0
    sections = {s[0]: s for s in _elf_sections(path.read_bytes())}
    assert ".nvFatBinSegment" in sections, "nvcc no longer emits .nvFatBinSegment"
    _, _, addr, _, size, _, _ = sections[".nvFatBinSegment"]
    base = info.dli_fbase
    wrappers = [_Wrapper.from_address(base + addr + off) for off in range(0, size, ctypes.sizeof(_Wrapper))]
    assert all(w.magic & 0xFFFFFFFF == WRAPPER_MAGIC for w in wrappers)
    return handle, wrappers  # the handle keeps the library (and the wrappers' memory) loaded


def _inspect(lib, address: int, max_size: int) -> tuple[int, int, int]:
    kind, size, segments = ctypes.c_uint32(), ctypes.c_uint64(), ctypes.c_uint32()
    rc = lib.foundry_image_inspect(address, max_size, ctypes.byref(kind), ctypes.byref(size), ctypes.byref(segments))
    assert rc == FOUNDRY_OK, lib.foundry_last_error().decode()
    return kind.value, size.value, segments.value


def _extract(lib, fatbin_address: int, size: int, arch: int) -> bytes:
    needed = ctypes.c_uint64()
    rc = lib.foundry_fatbin_extract_cubin(fatbin_address, size, arch, None, 0, ctypes.byref(needed))
    assert rc == FOUNDRY_OK, lib.foundry_last_error().decode()
    out = ctypes.create_string_buffer(max(needed.value, 1))
    got = ctypes.c_uint64()
    rc = lib.foundry_fatbin_extract_cubin(fatbin_address, size, arch, out, needed.value, ctypes.byref(got))
    assert rc == FOUNDRY_OK, lib.foundry_last_error().decode()
    assert got.value == needed.value
    return out.raw[:got.value]


def _buffer(data: bytes, slack: int = 0):
    """A ctypes copy of data followed by `slack` bytes of 0xEE (must not count as image)."""
    buf = ctypes.create_string_buffer(data + b"\xee" * slack, len(data) + slack)
    return buf, ctypes.addressof(buf)


# ---- raw images ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, kind", [("multi.fatbin", KIND_FATBIN), ("plain.fatbin", KIND_FATBIN),
                                        ("compressed.fatbin", KIND_FATBIN), ("sm90.cubin", KIND_CUBIN)])
def test_inspect_size_equals_file(lib, images, name, kind):
    data = images[name]
    buf, addr = _buffer(data, slack=256)
    assert _inspect(lib, addr, len(data) + 256) == (kind, len(data), 1)


def test_inspect_ptx_counts_the_nul(lib, images):
    text = images["kernels.ptx"]
    buf, addr = _buffer(text + b"\0", slack=64)
    assert _inspect(lib, addr, len(text) + 65) == (KIND_PTX, len(text) + 1, 1)


def test_inspect_truncated_fatbin_is_a_format_error(lib, images):
    data = images["multi.fatbin"]
    for cut in (0, 8, 16, 100, len(data) // 2, len(data) - 1):
        buf, addr = _buffer(data[:cut])
        kind = ctypes.c_uint32(99)
        rc = lib.foundry_image_inspect(addr, cut, ctypes.byref(kind), None, None)
        assert rc in (FOUNDRY_ERR_FORMAT,), (cut, rc)
        assert lib.foundry_last_error()
        assert kind.value == 99, "out-parameters must be untouched on failure"


def test_extract_cubin_matches_nvcc_cubin(lib, images):
    fatbin = images["multi.fatbin"]
    buf, addr = _buffer(fatbin)
    cubin = _extract(lib, addr, len(fatbin), 90)
    assert cubin == images["sm90.cubin"]
    assert _elf_kernel_names(cubin) == KERNEL_NAMES

    sm80 = _extract(lib, addr, len(fatbin), 80)
    assert sm80[:4] == b"\x7fELF" and _elf_kernel_names(sm80) == KERNEL_NAMES
    assert _extract(lib, addr, len(fatbin), 75) == b""
    # An sm_90 cubin that exists only compressed is reported absent, not decompressed.
    comp = images["compressed.fatbin"]
    cbuf, caddr = _buffer(comp)
    assert _extract(lib, caddr, len(comp), 90) == b""


def test_extract_cubin_refuses_small_capacity(lib, images):
    fatbin = images["multi.fatbin"]
    buf, addr = _buffer(fatbin)
    out = ctypes.create_string_buffer(16)
    got = ctypes.c_uint64(12345)
    rc = lib.foundry_fatbin_extract_cubin(addr, len(fatbin), 90, out, 16, ctypes.byref(got))
    assert rc == FOUNDRY_ERR_INVALID_ARGUMENT
    assert b"capacity" in lib.foundry_last_error()
    assert got.value == 12345


@pytest.mark.parametrize("seed", [0, 1, 0x9E3779B97F4A7C15, 2**64 - 1])
def test_hash64_matches_xxhash(lib, images, seed):
    samples = [b"", b"a", b"abc", bytes(range(256)) * 5, images["multi.fatbin"], images["sm90.cubin"]]
    for data in samples:
        buf, addr = _buffer(data)
        assert lib.foundry_hash64(addr, len(data), seed) == xxhash.xxh64_intdigest(data, seed)
    big = os.urandom(3 << 20)
    buf, addr = _buffer(big)
    assert lib.foundry_hash64(addr, len(big), seed) == xxhash.xxh64_intdigest(big, seed)


# ---- wrappers --------------------------------------------------------------------------------


def test_rdc_wrappers_from_a_real_shared_library(lib, rdc_library):
    _, wrappers = rdc_library
    v2 = [w for w in wrappers if w.version == 2]
    v1 = [w for w in wrappers if w.version == 1]
    # The device-link stub's __fatDeviceText, and one __fatbinwrap_* per translation unit.
    assert len(v2) == 1 and len(v1) == 2

    stub = v2[0]
    prelinked = []
    array = ctypes.cast(stub.filename_or_fatbins, ctypes.POINTER(ctypes.c_void_p))
    while array[len(prelinked)]:
        prelinked.append(array[len(prelinked)])
    assert len(prelinked) == 2
    expected = _container_size(stub.data) + sum(_container_size(p) for p in prelinked)
    kind, size, segments = _inspect(lib, ctypes.addressof(stub), ctypes.sizeof(_Wrapper))
    assert (kind, size, segments) == (KIND_WRAPPER, expected, 3)

    # Segment 0 (`data`) is the device-linked fatbin: its sm_90 cubin holds both kernels.
    linked = _extract(lib, stub.data, _container_size(stub.data), 90)
    assert linked[:4] == b"\x7fELF"
    assert {"_Z8kernel_aPf", "_Z8kernel_bPf"} <= _elf_kernel_names(linked)
    assert struct.unpack_from("<H", linked, 16)[0] == 2  # ET_EXEC: linked, loadable
    assert _extract(lib, stub.data, _container_size(stub.data), 75) == b""

    for w in v1:
        assert _inspect(lib, ctypes.addressof(w), ctypes.sizeof(_Wrapper)) == (KIND_WRAPPER, _container_size(w.data), 1)


def test_wrapper_v2_built_in_memory(lib, images):
    plain, multi = images["plain.fatbin"], images["multi.fatbin"]
    pbuf, paddr = _buffer(plain)
    mbuf, maddr = _buffer(multi)
    array = (ctypes.c_void_p * 3)(maddr, paddr, None)
    wrapper = _Wrapper(WRAPPER_MAGIC - (1 << 32), 2, maddr, ctypes.addressof(array))
    assert _inspect(lib, ctypes.addressof(wrapper), ctypes.sizeof(wrapper)) == (
        KIND_WRAPPER, 2 * len(multi) + len(plain), 3)
    v1 = _Wrapper(WRAPPER_MAGIC - (1 << 32), 1, paddr, None)
    assert _inspect(lib, ctypes.addressof(v1), ctypes.sizeof(v1)) == (KIND_WRAPPER, len(plain), 1)
    # Too short to hold the wrapper structure.
    rc = lib.foundry_image_inspect(ctypes.addressof(v1), 8, None, None, None)
    assert rc == FOUNDRY_ERR_FORMAT
