"""Corruption matrix: every way of breaking a valid archive is refused with a named error.

Each case breaks one thing in a valid synthetic archive (archive_factory) and checks both readers:

* ``foundry verify`` (verify_archive and the CLI's exit status): the check that fails and its reason;
* what LOAD reads before it needs a GPU, in its order: ``open_archive(path, check_environment=False)``
  (the manifest), the allocation log (``graphs.check_allocations``), every ``images/*.fimg`` LOAD
  would load (``foundry_container_check``, and ``foundry_image_file_dump``, which is LOAD's
  ``read_image_file``), then the payload (``foundry_payload_dump``: LOAD's ``read_payload``).

Expected: the exception class the code really raises and a message naming the file or field.
Cases the readers do NOT refuse properly are pinned by tests marked ``xfail(strict=True)`` whose
reason starts with "NOT REFUSED", "UNNAMED", "UNCLASSIFIED" or "HANGS": the assertion states the
wanted behaviour and ``raises=`` the way it fails today, so
fixing the code turns them into XPASS (a failure) and the marker must then be removed.
docs/archive-corruption.md tabulates the outcomes.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import archive_factory as af
from foundry_core import _native, cli, graphs
from foundry_core.errors import (
    ArchiveIOError,
    FormatError,
    FoundryError,
    MismatchError,
    NotFoundError,
    VersionError,
)
from foundry_core.fingerprint import COMPARED_FIELDS, check_fingerprint
from foundry_core.graphs import open_archive
from foundry_core.inspect import container_sections, image_file_info, payload_dump
from foundry_core.verify import FAIL, verify_archive

IMG_A = af.image_name(af.IMAGE_A)
IMG_B = af.image_name(af.IMAGE_B)
SECTION_NAMES = {af.SECTION_HEADER: "payload header", af.SECTION_TEMPLATE: "template", af.SECTION_MEMBER: "member"}
CASE_SECONDS = 30  # a case that takes longer has hung
# What a pinned defect fails with, so that an xfail cannot pass for an unrelated error:
DID_NOT_RAISE = pytest.fail.Exception  # pytest.raises saw no exception


def defect(raises: type[BaseException], reason: str):
    """A case the code does not handle as it should: the test asserts the wanted behaviour and
    is expected to fail with `raises` until the code is fixed (then it XPASSes, which fails)."""
    return pytest.mark.xfail(strict=True, raises=raises, reason=reason)


@pytest.fixture(autouse=True)
def _no_hang():
    """A case that blocks in Python (e.g. opening a FIFO) fails instead of hanging the run."""
    def expire(_sig, _frame):
        raise TimeoutError(f"corruption case still running after {CASE_SECONDS} s: the reader hangs")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(CASE_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    return af.make_archive(tmp_path / "arch")


# ---- the two readers ------------------------------------------------------------------------


def verify_failures(path: Path) -> dict[str, str]:
    return {c.name: c.detail for c in verify_archive(path) if c.status == FAIL}


def assert_verify_refuses(path: Path, check: str, *patterns: str, capsys=None) -> None:
    """verify fails `check` with a reason matching every pattern (and `foundry verify` exits 1
    with a FAIL line for it)."""
    failed = verify_failures(path)
    assert check in failed, f"verify did not fail {check!r}; failed: {failed}"
    for pattern in patterns:
        assert re.search(pattern, failed[check]), f"{check}: {failed[check]!r} does not match {pattern!r}"
    if capsys is not None:
        capsys.readouterr()
        code = cli.main(["verify", str(path)])
        out = capsys.readouterr().out
        assert code == 1, out
        assert re.search(rf"^FAIL\s+{re.escape(check)}\s", out, re.M), out


def loader_images(directory: Path) -> list[Path]:
    """The files LOAD loads as images (Registry::load_dir: images/*.fimg not starting with a dot)."""
    images = directory / "images"
    if not images.is_dir():
        return []
    return sorted(p for p in images.iterdir() if p.name.endswith(".fimg") and not p.name.startswith("."))


def loader_read(path: Path) -> dict:
    """What LOAD reads, in its order, as far as it goes without a GPU; returns the manifest."""
    manifest_path, manifest = open_archive(path, check_environment=False)
    directory = manifest_path.parent
    if manifest["region"]["size"]:
        graphs.check_allocations(directory, manifest)  # reads the allocation log (no GPU needed)
    for image in loader_images(directory):
        container_sections(image)
        image_file_info(image)
    payload_dump(directory / manifest["payload"])
    return manifest


def assert_loader_refuses(path: Path, error: type[Exception], *patterns: str) -> FoundryError:
    with pytest.raises(error) as info:
        loader_read(path)
    for pattern in patterns:
        assert re.search(pattern, str(info.value)), f"{str(info.value)!r} does not match {pattern!r}"
    return info.value


def edit_manifest(path: Path, change) -> None:
    m = json.loads((path / "manifest.json").read_text())
    change(m)
    (path / "manifest.json").write_text(json.dumps(m))


def test_the_unbroken_archive_passes_both_readers(archive):
    assert verify_failures(archive) == {}
    assert [g["name"] for g in loader_read(archive)["graphs"]] == list(af.DEFAULT_NAMES)


# ---- the payload: truncated, extended, a byte flipped in each part --------------------------


@pytest.mark.parametrize("keep", [0, 1, 7, 8, 63, 64, 100, 0.5, -8, -1])
def test_truncated_payload(archive, keep, capsys):
    p = archive / "graphs.fgr"
    data = p.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (keep if keep >= 0 else len(data) + keep)
    p.write_bytes(data[:n])
    why = "bad magic" if n == 0 else "truncated"
    assert_verify_refuses(archive, "payload", r"graphs\.fgr", why, capsys=capsys)
    assert_loader_refuses(archive, FormatError, r"graphs\.fgr: header: ", why)


def test_extended_payload(archive):
    p = archive / "graphs.fgr"
    p.write_bytes(p.read_bytes() + bytes(8))
    assert_verify_refuses(archive, "payload", r"graphs\.fgr", "extended")
    assert_loader_refuses(archive, FormatError, r"graphs\.fgr: header: extended")


# container header fields (csrc/archive/container.h) -> (error, message)
HEADER_FIELDS = {
    "magic": (0, FormatError, r"header: not a Foundry container \(bad magic\)"),
    "format_version": (8, VersionError, r"header: container format version \d+ is newer"),
    "section_count": (12, MismatchError, r"header: checksum mismatch"),
    "file_size": (16, MismatchError, r"header: checksum mismatch"),
    "table_checksum": (24, MismatchError, r"header: checksum mismatch"),
    "header_checksum": (32, MismatchError, r"header: checksum mismatch"),
    "reserved": (40, FormatError, r"header: reserved bytes 40\.\.63 are not zero"),
}


@pytest.mark.parametrize("field", list(HEADER_FIELDS))
def test_flipped_byte_in_the_container_header(archive, field):
    offset, error, pattern = HEADER_FIELDS[field]
    af.flip_byte(archive / "graphs.fgr", offset)
    assert_verify_refuses(archive, "payload", r"graphs\.fgr", pattern)
    assert_loader_refuses(archive, error, r"graphs\.fgr: ", pattern)


def test_flipped_byte_in_every_section_table_entry(archive):
    p = archive / "graphs.fgr"
    original = p.read_bytes()
    table = af.container_table(p)
    for entry in table:
        for field_offset in (0, 4, 8, 16, 24):  # type, flags, offset, size, checksum
            af.flip_byte(p, af.CONTAINER_HEADER + entry.index * af.CONTAINER_ENTRY + field_offset, 0x01)
            assert_verify_refuses(archive, "payload", r"graphs\.fgr", "section table: checksum mismatch")
            assert_loader_refuses(archive, MismatchError, r"graphs\.fgr: section table: checksum mismatch")
            p.write_bytes(original)


def test_flipped_byte_in_every_payload_section(archive, capsys):
    """Payload header, each template, each member (and any other section the writer adds): the
    first, middle and last byte of each, found through the container's table."""
    p = archive / "graphs.fgr"
    original = p.read_bytes()
    table = af.container_table(p)
    kinds = {e.type for e in table}
    assert {af.SECTION_HEADER, af.SECTION_TEMPLATE, af.SECTION_MEMBER} <= kinds, table
    assert sum(e.type == af.SECTION_MEMBER for e in table) == len(af.DEFAULT_NAMES)
    for entry in table:
        for offset in sorted({entry.offset, entry.offset + entry.size // 2, entry.offset + entry.size - 1}):
            af.flip_byte(p, offset)
            label = f"section {entry.index} \\(type {entry.type}\\): checksum mismatch"
            where = f"{SECTION_NAMES.get(entry.type, 'section type %d' % entry.type)} byte {offset}"
            failed = verify_failures(archive)
            assert re.search(label, failed.get("payload", "")), (where, failed)
            with pytest.raises(MismatchError, match=r"graphs\.fgr: " + label):
                loader_read(archive)
            p.write_bytes(original)
    af.flip_byte(p, table[-1].offset)
    assert_verify_refuses(archive, "payload", "checksum mismatch", capsys=capsys)


def test_nonzero_padding_between_sections(archive):
    p = archive / "graphs.fgr"
    table = sorted(af.container_table(p), key=lambda e: e.offset)
    gaps = [(a.offset + a.size, b.offset) for a, b in zip(table, table[1:]) if a.offset + a.size < b.offset]
    if not gaps:
        pytest.skip("every section of this payload ends 8-byte aligned: no padding to corrupt")
    af.flip_byte(p, gaps[0][0])
    assert_verify_refuses(archive, "payload", r"padding before section \d+")
    assert_loader_refuses(archive, FormatError, r"graphs\.fgr: padding before section \d+ .*non-zero bytes")


# ---- a payload consistently rewritten (checksums recomputed) ----------------------------------


def test_payload_header_announcing_more_graphs_than_it_holds(archive):
    """The checksums are resealed: what is left is read_payload's own count check."""
    p = archive / "graphs.fgr"
    header = next(e for e in af.container_table(p) if e.type == af.SECTION_HEADER)
    data = bytearray(p.read_bytes())
    members = int.from_bytes(data[header.offset + 4:header.offset + 8], "little")
    data[header.offset + 4:header.offset + 8] = (members + 1).to_bytes(4, "little")
    p.write_bytes(bytes(data))
    af.reseal(p)
    assert_verify_refuses(archive, "payload", "the header announces")
    assert_loader_refuses(archive, FormatError, r"graphs\.fgr: the header announces \d+ templates and 4 graphs, "
                                                r"the file holds \d+ and 3")


def test_payload_version_from_the_future(archive):
    p = archive / "graphs.fgr"
    header = next(e for e in af.container_table(p) if e.type == af.SECTION_HEADER)
    data = bytearray(p.read_bytes())
    data[header.offset:header.offset + 4] = (99).to_bytes(4, "little")
    p.write_bytes(bytes(data))
    af.reseal(p)
    assert_verify_refuses(archive, "payload", "graph payload version 99")
    assert_loader_refuses(archive, VersionError, r"graphs\.fgr: graph payload version 99, this build reads \d+ to \d+")


RESEAL_PROBE = r"""
import json, random, struct, sys
from pathlib import Path
import archive_factory as af
from foundry_core.errors import FoundryError
from foundry_core.inspect import payload_dump
path = Path(sys.argv[1]); original = path.read_bytes(); rng = random.Random(int(sys.argv[2]))
outcomes = []
for s in af.container_table(path):
    for k in range(int(sys.argv[3])):
        d = bytearray(original)
        if k % 3 == 0:
            d[s.offset + rng.randrange(s.size)] ^= 1 << rng.randrange(8)
        elif k % 3 == 1:
            i = s.offset + rng.randrange(max(s.size - 3, 1))
            v = struct.pack("<I", rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 1 << 20, 1 << 16, 0]))
            d[i:i + 4] = v[:len(d[i:i + 4])]
        else:
            for _ in range(4):
                d[s.offset + rng.randrange(s.size)] = rng.randrange(256)
        path.write_bytes(bytes(d)); af.reseal(path)
        try:
            payload_dump(path); outcomes.append([s.type, "ok", ""])
        except FoundryError as e:
            outcomes.append([s.type, type(e).__name__, str(e)])
print(json.dumps(outcomes))
"""


def test_resealed_garbage_in_every_section_never_crashes(archive):
    """Random damage to each section, checksums recomputed so read_payload's parsers see it (the
    libFuzzer target only covers the container). Run in a child so a crash is seen, not suffered."""
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here), str(here.parents[1]), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", RESEAL_PROBE, str(archive / "graphs.fgr"), "7", "60"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"the payload reader crashed (status {proc.returncode}):\n{proc.stderr[-3000:]}"
    outcomes = json.loads(proc.stdout)
    refused = [o for o in outcomes if o[1] != "ok"]
    assert refused, "no damaged payload was refused"
    assert {o[1] for o in refused} <= {"FormatError", "VersionError"}, {o[1] for o in refused}
    assert not any("unexpected internal error" in o[2] for o in refused)


def test_resealed_member_refusal_names_the_file(archive):
    p = archive / "graphs.fgr"
    member = next(e for e in af.container_table(p) if e.type == af.SECTION_MEMBER)
    data = bytearray(p.read_bytes())
    data[member.offset:member.offset + 8] = (1 << 40).to_bytes(8, "little")  # the name's length
    p.write_bytes(bytes(data))
    af.reseal(p)
    with pytest.raises(FormatError) as info:
        payload_dump(p)
    assert "graphs.fgr" in str(info.value)


def test_consistent_rewrite_is_not_detected(archive):
    """Checksums are not signatures (docs/trust-model.md): a payload rewritten with other kernel
    parameters, by the same public writer, passes every check."""
    doc = af.payload_doc()
    doc["templates"][0]["nodes"][2]["kernel"]["grid"] = [4096, 1, 1]
    doc["templates"][0]["nodes"][2]["kernel"]["params"] = "00000060ffffffff"
    (archive / "graphs.fgr").unlink()
    af.write_payload(archive / "graphs.fgr", doc)
    assert verify_failures(archive) == {}
    loader_read(archive)


# ---- image files -------------------------------------------------------------------------------


def test_flipped_byte_in_every_image_section(archive, capsys):
    p = archive / "images" / IMG_B
    original = p.read_bytes()
    for entry in af.container_table(p):
        for offset in (entry.offset, entry.offset + entry.size - 1):
            af.flip_byte(p, offset)
            label = f"section {entry.index} \\(type {entry.type}\\): checksum mismatch"
            assert_verify_refuses(archive, "images", f"images/{IMG_B}: ", label)
            assert_loader_refuses(archive, MismatchError, f"images/{IMG_B}: {label}")
            p.write_bytes(original)
    af.flip_byte(p, 0)
    assert_verify_refuses(archive, "images", f"images/{IMG_B}", "bad magic", capsys=capsys)
    assert_loader_refuses(archive, FormatError, f"images/{IMG_B}: header: not a Foundry container")


def test_truncated_image(archive):
    p = archive / "images" / IMG_A
    p.write_bytes(p.read_bytes()[:-1])
    assert_verify_refuses(archive, "images", f"images/{IMG_A}", "truncated")
    assert_loader_refuses(archive, FormatError, f"images/{IMG_A}: header: truncated")


def test_missing_image(archive, capsys):
    """Only verify can tell without a GPU: LOAD resolves kernels when it builds the graphs, where a
    missing image is NotFoundError "image <hash> is not loaded (is it in the archive?)"."""
    (archive / "images" / IMG_B).unlink()
    assert_verify_refuses(archive, "kernel references", f"names image {af.IMAGE_B:016x}, not in images/",
                          capsys=capsys)


def test_missing_images_directory(archive):
    shutil.rmtree(archive / "images")
    assert_verify_refuses(archive, "files", "missing images/")
    assert_verify_refuses(archive, "kernel references", "not in images/")


def test_image_under_another_hash(archive):
    (archive / "images" / IMG_B).rename(archive / "images" / "ffffffffffffffff.fimg")
    assert_verify_refuses(archive, "images", "images/ffffffffffffffff.fimg", "file name does not match the image hash")
    assert_loader_refuses(archive, FormatError, r"images/ffffffffffffffff\.fimg: file name does not match the image "
                                                f"hash {af.IMAGE_B:016x}")


def test_image_replaced_by_a_payload(archive):
    shutil.copy(archive / "graphs.fgr", archive / "images" / IMG_B)
    assert_verify_refuses(archive, "images", f"images/{IMG_B}", "not a kernel image file")
    assert_loader_refuses(archive, FormatError, "not a kernel image file")


def test_image_replaced_by_a_payload_names_the_file(archive):
    shutil.copy(archive / "graphs.fgr", archive / "images" / IMG_B)
    with pytest.raises(FormatError, match=re.escape(IMG_B)):
        image_file_info(archive / "images" / IMG_B)


# ---- missing and extra files ---------------------------------------------------------------------


def test_missing_payload(archive):
    (archive / "graphs.fgr").unlink()
    assert_verify_refuses(archive, "files", "missing graphs.fgr")
    assert_verify_refuses(archive, "payload", r"graphs\.fgr: no such file")
    assert_loader_refuses(archive, NotFoundError, r"graphs\.fgr: no such file")


def test_missing_manifest(archive, capsys):
    (archive / "manifest.json").unlink()
    assert_verify_refuses(archive, "archive", "no manifest.json", capsys=capsys)
    assert_loader_refuses(archive, ArchiveIOError, r"manifest\.json: no such manifest")


def test_missing_log(archive):
    """The allocation log is part of an archive: LOAD checks this process's placements against it."""
    (archive / "alloc_log.json").unlink()
    assert_verify_refuses(archive, "files", "missing alloc_log.json")
    assert_loader_refuses(archive, ArchiveIOError, r"no such allocation log")


@pytest.mark.parametrize("content, pattern", [
    ("{}", "alloc_log.json: not an allocation log"),
    ("[[1]]", "alloc_log.json: malformed allocation log entry"),
    ('[[0, "alloc", 0]]', "alloc_log.json: malformed allocation log entry"),
    ("[1,", "alloc_log.json"),
    (b"\xff\xfe", "alloc_log.json"),
    ("[" * 100_000 + "]" * 100_000, "alloc_log.json"),
])
def test_corrupt_log_is_refused_by_load(archive, content, pattern):
    p = archive / "alloc_log.json"
    p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
    assert_loader_refuses(archive, FormatError, pattern)


def test_corrupt_log_is_refused_by_verify(archive):
    (archive / "alloc_log.json").write_text("[1,")
    assert_verify_refuses(archive, "files", "alloc_log.json")


@pytest.mark.parametrize("where", ["notes.txt", "images/stray.bin", "images/.hidden.fimg"])
def test_extra_file(archive, where, capsys):
    """LOAD reads only what the manifest names and images/*.fimg (not dot files), so these are
    verify's to report."""
    (archive / where).write_bytes(b"x")
    assert_verify_refuses(archive, "files", f"unexpected file {re.escape(where)}", capsys=capsys)


def test_extra_image_file_that_is_not_an_image(archive):
    (archive / "images" / "00000000000000ff.fimg").write_bytes(b"not an image")
    assert_verify_refuses(archive, "images", "images/00000000000000ff.fimg", "bad magic")
    assert_loader_refuses(archive, FormatError, r"images/00000000000000ff\.fimg: header: not a Foundry container")


# ---- the manifest: version, lies about the payload -------------------------------------------------


@pytest.mark.parametrize("version, error, pattern", [
    (2, VersionError, "archive format version 2, this Foundry reads 1"),
    (0, VersionError, "archive format version 0, this Foundry reads 1"),
    (-1, VersionError, "archive format version -1"),
    ("1", FormatError, "'version' has the wrong type \\(str\\)"),
    (1.0, FormatError, "'version' has the wrong type \\(float\\)"),
    (True, FormatError, "'version' has the wrong type \\(bool\\)"),
])
def test_manifest_format_version(archive, version, error, pattern, capsys):
    edit_manifest(archive, lambda m: m.__setitem__("version", version))
    assert_verify_refuses(archive, "manifest", r"manifest\.json: " + pattern, capsys=capsys)
    assert_loader_refuses(archive, error, r"manifest\.json: " + pattern)


def test_manifest_of_another_format(archive):
    edit_manifest(archive, lambda m: m.__setitem__("format", "safetensors"))
    assert_verify_refuses(archive, "manifest", "not a Foundry archive manifest")
    assert_loader_refuses(archive, FormatError,
                          r"manifest\.json: not a Foundry archive manifest \(format 'safetensors'\)")


def graph_archive_check(path: Path, monkeypatch) -> None:
    """The payload-vs-manifest check LOAD makes in GraphArchive.__init__, run without a GPU: the
    native graph set is replaced by the payload's real graphs (count and names, from foundry_payload_dump),
    and outputs are not rebuilt (that needs torch on a GPU)."""
    manifest_path, manifest = open_archive(path, check_environment=False)
    names = [m["name"] for m in payload_dump(manifest_path.parent / manifest["payload"])["members"]]
    stored = len(names)
    real_call = _native.call

    def call(name, *args):
        if name == "foundry_graphset_info":
            args[1]._obj.value, args[2]._obj.value = stored, 1
            return
        if name == "foundry_graphset_name":
            args[2].value = names[args[1]].encode()
            return
        real_call(name, *args)

    monkeypatch.setattr(_native, "call", call)
    monkeypatch.setattr(graphs, "rebuild_outputs", lambda outputs, owner: None)
    graphs.GraphArchive(manifest_path, manifest, ctypes.c_void_p(), graphs.LoadTimes())


@pytest.mark.parametrize("names, verify_reason", [
    (["bs=1", "bs=2", "prefill", "ghost"], "manifest graph 'ghost' is not in the payload"),
    (["bs=1", "bs=2"], "payload graph 'prefill' is not in the manifest"),
])
def test_manifest_lists_another_number_of_graphs(archive, names, verify_reason, monkeypatch, capsys):
    edit_manifest(archive, lambda m: m.__setitem__("graphs", af.manifest_doc(names)["graphs"]))
    assert_verify_refuses(archive, "graph references", verify_reason, capsys=capsys)
    loader_read(archive)  # the count is compared only once the payload is open (LOAD, below)
    with pytest.raises(FoundryError, match=rf"manifest\.json: the manifest lists {len(names)} graphs, the payload holds 3"):
        graph_archive_check(archive, monkeypatch)


def test_manifest_with_graphs_in_another_order_is_refused_by_load(archive, monkeypatch):
    edit_manifest(archive, lambda m: m.__setitem__("graphs", af.manifest_doc(["bs=2", "bs=1", "prefill"])["graphs"]))
    assert_verify_refuses(archive, "graph references", "another order")
    with pytest.raises(FoundryError):
        graph_archive_check(archive, monkeypatch)


def test_manifest_count_lie_is_a_format_error(archive, monkeypatch):
    edit_manifest(archive, lambda m: m["graphs"].pop())
    with pytest.raises(FormatError):
        graph_archive_check(archive, monkeypatch)


@pytest.mark.parametrize("region, reason", [
    ({"size": 4096}, r"the manifest's region \(0x600000000000, 4096\) differs from the payload's"),
    ({"base": 0x7000_0000_0000}, r"the manifest's region \(0x700000000000, 1073741824\) differs"),
])
def test_manifest_lies_about_the_region(archive, region, reason):
    edit_manifest(archive, lambda m: m["region"].update(region))
    assert_verify_refuses(archive, "output references", reason)


def test_manifest_output_larger_than_the_region(archive):
    edit_manifest(archive, lambda m: m["graphs"][0]["outputs"]["tensors"][0].update(shape=[1 << 40, 4]))
    assert_verify_refuses(archive, "output references", r"graph 'bs=1' output 0 .* lies outside the region")


def test_manifest_tensor_output_without_a_tensor(archive):
    edit_manifest(archive, lambda m: m["graphs"][0]["outputs"].update(tensors=[]))
    assert "manifest" in verify_failures(archive) or "output references" in verify_failures(archive)
    assert_loader_refuses(archive, FormatError, "tensor")


# ---- names leaving the archive -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "../arch/graphs.fgr", "/etc/passwd", "sub/graphs.fgr", "..", ".", "",
                                  "a\\b", "graphs.fgr\0"])
def test_payload_name_leaving_the_archive(archive, name, capsys):
    edit_manifest(archive, lambda m: m.__setitem__("payload", name))
    pattern = re.escape(repr(name)) + " is not a plain file name inside the archive"
    assert_verify_refuses(archive, "manifest", pattern, capsys=capsys)
    assert_loader_refuses(archive, FormatError, r"manifest\.json: " + pattern)


@pytest.mark.parametrize("name", ["sub/alloc_log.json", "../alloc_log.json", "/tmp/alloc_log.json"])
def test_log_name_leaving_the_archive_verify(archive, name):
    edit_manifest(archive, lambda m: m.__setitem__("log", name))
    assert_verify_refuses(archive, "manifest", re.escape(repr(name)) + " is not a plain file name inside the archive")


@pytest.mark.parametrize("name", ["sub/alloc_log.json", "../alloc_log.json"])
def test_log_name_leaving_the_archive_loader(archive, name):
    (archive.parent / "alloc_log.json").write_text("[]")  # a valid log outside the archive
    edit_manifest(archive, lambda m: m.__setitem__("log", name))
    assert_loader_refuses(archive, FormatError, re.escape(repr(name)))


def test_log_name_of_the_wrong_type(archive):
    edit_manifest(archive, lambda m: m.__setitem__("log", 5))
    assert_verify_refuses(archive, "manifest", "'log' has the wrong type")
    assert_loader_refuses(archive, FormatError, "'log'")


def test_symlinked_log(archive):
    _link_out(archive, "alloc_log.json")
    assert_verify_refuses(archive, "symbolic links", "alloc_log.json is a symbolic link")
    assert_loader_refuses(archive, (FormatError, ArchiveIOError), "alloc_log.json")


def test_payload_name_naming_a_directory(archive):
    edit_manifest(archive, lambda m: m.__setitem__("payload", "images"))
    assert_verify_refuses(archive, "payload", "images: not a regular file")
    assert_loader_refuses(archive, ArchiveIOError, r"/images: not a regular file")


# ---- symbolic links ----------------------------------------------------------------------------------------


def _link_out(archive: Path, relative: str) -> Path:
    """Moves archive/relative outside the archive and leaves a symlink to it in its place."""
    inside = archive / relative
    outside = archive.parent / ("outside-" + inside.name)
    shutil.move(inside, outside)
    inside.symlink_to(outside)
    return outside


def test_symlinked_manifest(archive, capsys):
    _link_out(archive, "manifest.json")
    assert_verify_refuses(archive, "symbolic links", "manifest.json is a symbolic link", capsys=capsys)
    assert_verify_refuses(archive, "manifest", "the manifest is a symbolic link")
    assert_loader_refuses(archive, FormatError, r"manifest\.json: the manifest is a symbolic link")


def test_symlinked_payload(archive):
    _link_out(archive, "graphs.fgr")
    assert_verify_refuses(archive, "symbolic links", "graphs.fgr is a symbolic link")
    assert_verify_refuses(archive, "paths", "'graphs.fgr' resolves outside the archive")
    assert_loader_refuses(archive, ArchiveIOError, r"graphs\.fgr: is a symbolic link; refusing to follow it")


def test_symlinked_image(archive):
    _link_out(archive, f"images/{IMG_B}")
    assert_verify_refuses(archive, "symbolic links", f"images/{IMG_B} is a symbolic link")
    assert_verify_refuses(archive, "images", f"images/{IMG_B}: .*is a symbolic link")
    assert_loader_refuses(archive, ArchiveIOError, f"images/{IMG_B}: is a symbolic link; refusing to follow it")


def test_payload_symlinked_to_a_file_inside_the_archive(archive):
    (archive / "graphs.fgr").unlink()
    (archive / "graphs.fgr").symlink_to(archive / "images" / IMG_A)
    assert_verify_refuses(archive, "symbolic links", "graphs.fgr is a symbolic link")
    assert_loader_refuses(archive, ArchiveIOError, "is a symbolic link")


def test_symlinked_images_directory_verify(archive):
    _link_out(archive, "images")
    assert_verify_refuses(archive, "symbolic links", "images is a symbolic link")


@defect(
    DID_NOT_RAISE,
    "NOT REFUSED by LOAD: Registry::load_dir opens <archive>/images through a symlink (O_NOFOLLOW guards "
    "only each file's last component), so a linked images/ directory is loaded from wherever it points "
    "(verify refuses it)")
def test_symlinked_images_directory_loader(archive):
    _link_out(archive, "images")
    assert_loader_refuses(archive, ArchiveIOError, "symbolic link")


# ---- foreign files in place of archive files ---------------------------------------------------------


def _foreign(kind: str, archive: Path) -> bytes:
    if kind == "random":
        return random.Random(5).randbytes(1024)
    if kind == "elf":
        return Path(sys.executable).resolve().read_bytes()[:65536]
    if kind == "empty":
        return b""
    if kind == "json":
        return (archive / "manifest.json").read_bytes()
    if kind == "magic-then-random":
        return b"FDRYCNT1" + random.Random(6).randbytes(1016)
    if kind == "image":
        return (archive / "images" / IMG_A).read_bytes()
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, error, pattern", [
    ("random", FormatError, "header: not a Foundry container \\(bad magic\\)"),
    ("elf", FormatError, "header: not a Foundry container \\(bad magic\\)"),
    ("empty", FormatError, "header: not a Foundry container \\(bad magic\\)"),
    ("json", FormatError, "header: not a Foundry container \\(bad magic\\)"),
    ("magic-then-random", VersionError, "header: container format version \\d+ is newer than this build reads"),
    ("image", FormatError, "not a graph payload \\(no kernel name table\\)"),  # a valid container of another kind
])
def test_payload_replaced_by_a_foreign_file(archive, kind, error, pattern, capsys):
    (archive / "graphs.fgr").write_bytes(_foreign(kind, archive))
    assert_verify_refuses(archive, "payload", r"graphs\.fgr: " + pattern, capsys=capsys)
    assert_loader_refuses(archive, error, r"graphs\.fgr: " + pattern)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_payload_replaced_by_a_special_file(archive, kind):
    p = archive / "graphs.fgr"
    p.unlink()
    os.mkfifo(p) if kind == "fifo" else p.mkdir()
    assert_verify_refuses(archive, "payload", r"graphs\.fgr: not a regular file")
    assert_loader_refuses(archive, ArchiveIOError, r"graphs\.fgr: not a regular file")


def test_image_replaced_by_a_fifo(archive):
    p = archive / "images" / IMG_B
    p.unlink()
    os.mkfifo(p)
    assert_verify_refuses(archive, "images", f"images/{IMG_B}: .*not a regular file")
    assert_loader_refuses(archive, ArchiveIOError, f"images/{IMG_B}: not a regular file")


def test_manifest_replaced_by_a_foreign_file(archive):
    (archive / "manifest.json").write_bytes(_foreign("elf", archive))
    assert_verify_refuses(archive, "manifest", "manifest is not valid JSON")
    assert_loader_refuses(archive, FormatError, r"manifest\.json: manifest is not valid JSON")


def test_oversized_manifest(archive):
    from foundry_core.manifest import MAX_MANIFEST_BYTES

    with open(archive / "manifest.json", "r+b") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: costs no disk
    assert_verify_refuses(archive, "manifest", f"manifest of {MAX_MANIFEST_BYTES + 1} bytes is larger than")
    assert_loader_refuses(archive, FormatError, r"manifest\.json: manifest of \d+ bytes is larger than the \d+ allowed")


def test_manifest_replaced_by_a_directory(archive):
    (archive / "manifest.json").unlink()
    (archive / "manifest.json").mkdir()
    assert_loader_refuses(archive, ArchiveIOError, r"manifest\.json")


def _open_in_child(archive: Path, what: str, timeout: float = 3.0) -> subprocess.CompletedProcess | None:
    """Runs open_archive or verify on `archive` in a child process; None when it is still running
    after `timeout` seconds (then it is killed)."""
    code = {"open": "from foundry_core.graphs import open_archive as f; f(sys.argv[1], check_environment=False)",
            "verify": "from foundry_core.verify import verify_archive as f; print(f(sys.argv[1]))"}[what]
    try:
        return subprocess.run([sys.executable, "-c", "import sys; " + code, str(archive)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def test_manifest_replaced_by_a_fifo(archive):
    (archive / "manifest.json").unlink()
    os.mkfifo(archive / "manifest.json")
    for what in ("open", "verify"):
        proc = _open_in_child(archive, what)
        assert proc is not None, f"{what} on a FIFO manifest still blocked after 3 s"
        assert "Error" in proc.stderr or "FAIL" in proc.stdout


# ---- the environment fingerprint ---------------------------------------------------------------------------


def _other(field: str, value):
    return value + 1 if isinstance(value, int) else f"{value}-other"


@pytest.mark.parametrize("field", COMPARED_FIELDS)
def test_fingerprint_field_edited(field):
    saved = dict(af.FINGERPRINT)
    current = {**saved, field: _other(field, saved[field])}
    with pytest.raises(MismatchError, match=rf"archive fingerprint mismatch on '{field}': saved "):
        check_fingerprint(saved, current)
    # The same field missing on this machine is a mismatch too.
    with pytest.raises(MismatchError, match=rf"on '{field}'"):
        check_fingerprint(saved, {k: v for k, v in saved.items() if k != field})


def test_fingerprint_extra_field_is_compared():
    saved = dict(af.FINGERPRINT)
    with pytest.raises(MismatchError, match="on 'engine'"):
        check_fingerprint(saved, {**saved, "engine": "vllm"})


@pytest.mark.parametrize("field", COMPARED_FIELDS)
def test_fingerprint_edited_in_the_archive(archive, field, monkeypatch):
    """The archive's fingerprint edited, this machine's as saved: LOAD's open_archive (with the
    environment check) and verify's fingerprint check both name the field."""
    edit_manifest(archive, lambda m: m["fingerprint"].update({field: _other(field, m["fingerprint"][field])}))
    monkeypatch.setattr(graphs, "current_fingerprint", lambda extra=None: {**af.FINGERPRINT, **(extra or {})})
    with pytest.raises(MismatchError, match=rf"on '{field}'"):
        open_archive(archive)
    import foundry_core.verify as verify

    monkeypatch.setattr(verify, "_machine_fingerprint", lambda fields: (dict(af.FINGERPRINT), ""))
    assert_verify_refuses(archive, "fingerprint", f"archive fingerprint mismatch on '{field}'")


@pytest.mark.parametrize("field", COMPARED_FIELDS)
def test_fingerprint_field_deleted_from_the_archive(archive, field, monkeypatch):
    edit_manifest(archive, lambda m: m["fingerprint"].pop(field))
    other = {**af.FINGERPRINT, field: _other(field, af.FINGERPRINT[field])}
    monkeypatch.setattr(graphs, "current_fingerprint", lambda extra=None: other)
    with pytest.raises((MismatchError, FormatError), match=field):
        open_archive(archive)
