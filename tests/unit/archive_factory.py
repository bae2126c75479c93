"""Synthetic archives for tests that need no GPU (shared by the hardening tests).

The same construction as tests/unit/test_inspect_verify_diff.py: a payload written from JSON by
``foundry_payload_from_json``, image files written by ``foundry_image_file_write_synthetic``, an
empty allocation log and a manifest with a hand-written fingerprint. The result passes
``foundry verify`` (the fingerprint check is skipped without a GPU).

Also: the section table of a container file, parsed here independently of the native reader, so
tests can aim corruption at one section.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from foundry_core import _native
from foundry_core.manifest import write_manifest

REGION_BASE = 0x6000_0000_0000
REGION_SIZE = 1 << 30
IMAGE_A = 0xA1B2C3D4E5F60718
IMAGE_B = 0x0123456789ABCDEF
KERNEL = "_Z6kernelPfi"
INIT = "_Z4initv"
GEMM = "gemm_kernel"
FINGERPRINT = {
    "gpu_name": "NVIDIA H200", "compute_capability": "9.0", "driver_version": 13000, "cuda_runtime": "13.0",
    "torch_version": "2.9.0", "foundry_version": "0.1.0", "engine": "synthetic",
}
CUBIN = b"\x7fELF\x02\x01\x01" + bytes(57)
PTX = b".version 9.0\n.target sm_90\n.entry gemm_kernel()\n{\n ret;\n}\n\x00"
DEFAULT_NAMES = ("bs=1", "bs=2", "prefill")

# Payload section types (csrc/graph/payload.cpp).
SECTION_HEADER, SECTION_TEMPLATE, SECTION_MEMBER, SECTION_NAMES, SECTION_CACHE_CONFIGS = 1, 2, 3, 4, 5
PREFER_SHARED = 1  # CU_FUNC_CACHE_PREFER_SHARED
CONTAINER_HEADER = 64
CONTAINER_ENTRY = 32


def image_name(image_hash: int) -> str:
    return f"{image_hash:016x}.fimg"


def write_image(images: Path, image_hash: int, entries: list[str], payload: bytes, loader: int = 0) -> Path:
    images.mkdir(parents=True, exist_ok=True)
    path = images / image_name(image_hash)
    names = (ctypes.c_char_p * max(len(entries), 1))(*[e.encode() for e in entries])
    _native.call("foundry_image_file_write_synthetic", os.fsencode(path), image_hash, loader, names, len(entries),
                 payload, len(payload))
    return path


def write_payload(path: Path, doc: dict) -> None:
    _native.call("foundry_payload_from_json", json.dumps(doc).encode(), os.fsencode(path))


def kernel(image: int, name: str, grid: int = 1, cache_config: int = 0) -> dict:
    return {"kind": "kernel", "kernel": {
        "image": f"{image:016x}", "name": name, "grid": [grid, 1, 1], "block": [128, 1, 1], "shared_mem": 0,
        "params": "0000006000000000", "slots": [{"offset": 0, "size": 8}], "attrs": [],
        "func": {"max_dynamic_shared": 0, "preferred_carveout": -1, "required_cluster": [0, 0, 0],
                 "non_portable_cluster": 0, "cluster_scheduling": 0, "cache_config": cache_config}}}


def edge(a: int, b: int) -> dict:
    return {"from": a, "to": b, "from_port": 0, "to_port": 0, "type": 0}


def payload_doc(names: tuple[str, ...] = DEFAULT_NAMES) -> dict:
    """Two templates (decode, prefill); every graph but the last uses decode, the second with a delta.
    GEMM has a cache preference (as Triton gives kernels above 48 KiB of shared memory), so the
    payload holds the optional kernel cache-config table too."""
    decode = {
        "nodes": [
            kernel(IMAGE_A, INIT),
            {"kind": "memset", "memset": {"dst": REGION_BASE + 4096, "pitch": 0, "value": 0, "element_size": 4,
                                          "width": 256, "height": 1}},
            kernel(IMAGE_A, KERNEL, grid=8),
            kernel(IMAGE_B, GEMM, cache_config=PREFER_SHARED),
        ],
        "edges": [edge(0, 1), edge(1, 2), edge(2, 3)],
        "children": [],
    }
    prefill = {"nodes": [kernel(IMAGE_B, GEMM, grid=64, cache_config=PREFER_SHARED)], "edges": [], "children": []}
    refs = [{"offset": 0, "size": 1 << 20, "kind": 1}]
    members = []
    for i, n in enumerate(names):
        last = i == len(names) - 1 and len(names) > 1
        delta = [{"node": 2, "value": kernel(IMAGE_A, KERNEL, grid=16 + i)}] if i == 1 and not last else []
        members.append({"name": n, "template": 1 if last else 0, "delta": delta, "refs": refs})
    return {"version": 3, "region": {"base": REGION_BASE, "size": REGION_SIZE}, "event_count": 0,
            "templates": [decode, prefill], "members": members}


def manifest_doc(names: tuple[str, ...] | list[str] = DEFAULT_NAMES) -> dict:
    return {
        "format": "foundry-archive", "version": 1, "fingerprint": dict(FINGERPRINT), "payload": "graphs.fgr",
        "region": {"base": REGION_BASE, "size": REGION_SIZE, "high_water": 3 << 20},
        "graphs": [{"name": n, "outputs": {"kind": "tensor", "tensors": [
            {"ptr": REGION_BASE + 8192 * (i + 1), "shape": [2, 4], "stride": [4, 1], "dtype": "float32"}]}}
            for i, n in enumerate(names)],
        "log": "alloc_log.json", "created": "2025-01-01T00:00:00Z",
    }


def write_archive_files(path: Path, names: tuple[str, ...] = DEFAULT_NAMES, after_each=None) -> Path:
    """Writes every file of an archive into an existing directory ``path``, in SAVE's order
    (payload, images, log, manifest last); calls ``after_each(file)`` after each one."""
    step = after_each or (lambda _p: None)
    write_payload(path / "graphs.fgr", payload_doc(names))
    step(path / "graphs.fgr")
    step(write_image(path / "images", IMAGE_A, [KERNEL, INIT], CUBIN, loader=1))
    step(write_image(path / "images", IMAGE_B, [GEMM], PTX))
    (path / "alloc_log.json").write_text("[]")
    step(path / "alloc_log.json")
    write_manifest(path / "manifest.json", manifest_doc(names))
    step(path / "manifest.json")
    return path


def make_archive(path: Path, names: tuple[str, ...] = DEFAULT_NAMES) -> Path:
    path.mkdir(parents=True)
    return write_archive_files(path, names)


# ---- the container's section table ----------------------------------------------------------


@dataclass(frozen=True)
class SectionEntry:
    index: int
    type: int
    flags: int
    offset: int
    size: int
    checksum: int


def container_table(path: Path) -> list[SectionEntry]:
    """The section table of a container file (layout in csrc/archive/container.h)."""
    data = path.read_bytes()
    magic, _version, count = struct.unpack_from("<8sII", data, 0)
    assert magic == b"FDRYCNT1", f"{path} is not a container"
    out = []
    for i in range(count):
        t, flags, offset, size, checksum = struct.unpack_from("<IIQQQ", data, CONTAINER_HEADER + i * CONTAINER_ENTRY)
        out.append(SectionEntry(i, t, flags, offset, size, checksum))
    return out


def flip_byte(path: Path, offset: int, mask: int = 0x40) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def archive_contents(path: Path) -> dict[str, bytes]:
    """Every regular file under an archive directory, by relative path, with its bytes."""
    out = {}
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = Path(dirpath, f)
            out[str(p.relative_to(path))] = p.read_bytes()
    return out


def _hash64(data: bytes) -> int:
    return _native.lib().foundry_hash64(data, len(data), 0) if data else _native.lib().foundry_hash64(None, 0, 0)


def reseal(path: Path) -> None:
    """Recomputes every checksum of a container file (sections, table, header), as anyone editing an
    archive could: what is left for the reader to catch is what the checksums cannot."""
    data = bytearray(path.read_bytes())
    count = struct.unpack_from("<I", data, 12)[0]
    for i in range(count):
        entry = CONTAINER_HEADER + i * CONTAINER_ENTRY
        offset, size = struct.unpack_from("<QQ", data, entry + 8)
        if offset <= len(data) and size <= len(data) - offset:
            struct.pack_into("<Q", data, entry + 24, _hash64(bytes(data[offset:offset + size])))
    table = bytes(data[CONTAINER_HEADER:CONTAINER_HEADER + count * CONTAINER_ENTRY])
    struct.pack_into("<Q", data, 24, _hash64(table))
    struct.pack_into("<Q", data, 32, _hash64(bytes(data[:32])))
    path.write_bytes(bytes(data))
