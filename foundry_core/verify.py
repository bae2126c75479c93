"""`foundry verify`: is an archive intact, self-consistent and usable on this machine?

Each check reports ok, FAIL (with the reason) or skipped (with why): structure (manifest valid,
payload and every image file pass the container check, no unexpected files, no symbolic links,
no name escaping the archive), checksums (inside the container check), the fingerprint against
this machine (skipped without a GPU), and internal references (kernels name archived images and
entries, the manifest's graphs are the payload's, output tensors lie inside the region).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundry_core.archive_names import BLOB_NAME, CACHES_DIR, ENGINE_INFO_NAME, LIST_NAME, STATE_NAME
from foundry_core.cache_list import file_digest, listed_blobs
from foundry_core.errors import FoundryError
from foundry_core.fingerprint import COMPARED_FIELDS, check_fingerprint, current_fingerprint
from foundry_core.inspect import (
    IMAGE_FILE,
    IMAGES_DIR,
    container_sections,
    image_file_info,
    image_files,
    payload_dump,
    rank_archives,
    stored_kernels,
)
from foundry_core.manifest import MANIFEST_NAME, read_manifest

OK, FAIL, SKIPPED = "ok", "FAIL", "skipped"
DEFAULT_PAYLOAD = "graphs.fgr"
DEFAULT_LOG = "alloc_log.json"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
TORCH_FIELDS = ("torch_version", "cuda_runtime")
MAX_LISTED = 5  # problems named in one check's reason


@dataclass
class Check:
    name: str
    status: str  # OK, FAIL or SKIPPED
    detail: str

    @property
    def passed(self) -> bool:
        return self.status != FAIL


def _listed(problems: list[str]) -> str:
    more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    return "; ".join(problems[:MAX_LISTED]) + more


def _result(name: str, problems: list[str], ok_detail: str) -> Check:
    return Check(name, FAIL, _listed(problems)) if problems else Check(name, OK, ok_detail)


# ---- structure --------------------------------------------------------------------------------


def _symlinks(directory: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):  # does not descend into linked dirs
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            if p.is_symlink():
                found.append(f"{p.relative_to(directory)} is a symbolic link (to {os.readlink(p)})")
    return found


def _plain_name(name: Any, directory: Path) -> str | None:
    """Why a name from the manifest is not a plain file inside the archive, or None."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return f"{name!r} is not a plain file name inside the archive"
    if not (directory / name).resolve().is_relative_to(directory.resolve()):
        return f"{name!r} resolves outside the archive"
    return None


def _unexpected_files(directory: Path, expected: set[str]) -> list[str]:
    problems = []
    for entry in sorted(directory.iterdir()):
        if entry.name == IMAGES_DIR and entry.is_dir() and not entry.is_symlink():
            for image in sorted(entry.iterdir()):
                if not IMAGE_FILE.fullmatch(image.name) or not image.is_file():
                    problems.append(f"unexpected file {IMAGES_DIR}/{image.name}")
        elif entry.name not in expected:
            problems.append(f"unexpected file {entry.name}")
    return problems


def _log_problems(path: Path) -> list[str]:
    """LOAD compares placements with the log: one it cannot read would stop it."""
    from foundry_core.graphs import read_saved_log

    try:
        read_saved_log(path)
    except FoundryError as exc:
        return [str(exc)]
    return []


def _layout_checks(directory: Path, manifest: dict | None) -> list[Check]:
    # Without a readable manifest, the names SAVE writes are assumed.
    names = [manifest["payload"], *([manifest["log"]] if "log" in manifest else [])] if manifest else [
        DEFAULT_PAYLOAD, DEFAULT_LOG]
    escaping = [why for why in (_plain_name(n, directory) for n in names) if why]
    checks = [_result("symbolic links", _symlinks(directory), "none"),
              _result("paths", escaping, "every file named by the manifest is inside the archive")]
    # An engine's rank directory also holds its recorded state and its list of carried caches.
    expected = {MANIFEST_NAME, IMAGES_DIR, STATE_NAME, LIST_NAME, *(n for n in names if isinstance(n, str))}
    problems = _unexpected_files(directory, expected)
    problems += [f"missing {n}" for n in names if isinstance(n, str) and not (directory / n).exists()]
    log_name = names[1] if len(names) > 1 else None
    if isinstance(log_name, str) and not escaping and (directory / log_name).exists():
        problems += _log_problems(directory / log_name)
    if not (directory / IMAGES_DIR).is_dir():
        problems.append(f"missing {IMAGES_DIR}/")
    checks.append(_result("files", problems, "only the manifest, payload, log and images"))
    return checks


def _payload_check(directory: Path, name: str) -> tuple[Check, dict | None]:
    path = directory / name
    try:
        sections = container_sections(path)
        payload = payload_dump(path)
    except FoundryError as exc:
        return Check("payload", FAIL, str(exc)), None
    detail = (f"{name}: {sections} sections, checksums valid, {len(payload['members'])} graphs in "
              f"{len(payload['templates'])} groups")
    return Check("payload", OK, detail), payload


def _image_checks(directory: Path) -> tuple[Check, dict[str, dict]]:
    images: dict[str, dict] = {}
    problems = []
    files = list(image_files(directory).values())
    for p in files:
        try:
            container_sections(p)
            images[p.name[:16]] = image_file_info(p)
        except FoundryError as exc:
            problems.append(f"{IMAGES_DIR}/{p.name}: {exc}")
    return _result("images", problems, f"{len(files)} image files, checksums valid"), images


# ---- fingerprint ------------------------------------------------------------------------------


def _machine_fingerprint(fields: list[str]) -> tuple[dict | None, str]:
    """This machine's fingerprint, or None and why it cannot be taken (no driver, no GPU)."""
    if any(f in fields for f in TORCH_FIELDS) and "torch" not in sys.modules:
        try:
            import torch  # noqa: F401 - current_fingerprint reads the versions of an imported torch
        except ImportError:
            pass
    try:
        return current_fingerprint(), ""
    except FoundryError as exc:
        return None, str(exc)


def _fingerprint_check(saved: dict) -> Check:
    fields = [f for f in COMPARED_FIELDS if f in saved]
    current, why = _machine_fingerprint(fields)
    if current is None:
        return Check("fingerprint", SKIPPED, f"no GPU on this machine, not compared ({why})")
    fields = [f for f in fields if f in current or f not in TORCH_FIELDS]
    try:
        check_fingerprint(saved, current, tuple(fields))
    except FoundryError as exc:
        return Check("fingerprint", FAIL, str(exc))
    others = sorted(set(saved) - set(fields))
    note = f" (not comparable here: {', '.join(others)})" if others else ""
    return Check("fingerprint", OK, f"{', '.join(fields)} match this machine{note}")


# ---- internal references ----------------------------------------------------------------------


def _kernel_references(payload: dict, images: dict[str, dict], present: set[str]) -> Check:
    problems = []
    for where, k in stored_kernels(payload):
        image = k["image"]
        if image not in present:
            problems.append(f"{where}: kernel {k['name']} names image {image}, not in {IMAGES_DIR}/")
        elif image in images and k["name"] not in images[image]["entries"]:
            problems.append(f"{where}: kernel {k['name']} is not an entry of image {image}")
    count = sum(1 for _ in stored_kernels(payload))
    return _result("kernel references", problems, f"{count} stored kernels name archived images and entries")


def _graph_references(manifest: dict, payload: dict) -> Check:
    listed = [g["name"] for g in manifest["graphs"]]
    stored = [m["name"] for m in payload["members"]]
    problems = [f"manifest graph {n!r} is not in the payload" for n in listed if n not in stored]
    problems += [f"payload graph {n!r} is not in the manifest" for n in stored if n not in listed]
    if not problems and listed != stored:
        problems.append("the manifest lists the payload's graphs in another order")
    return _result("graph references", problems, f"the manifest's {len(listed)} graphs are the payload's, in order")


def _tensor_span(t: dict) -> int:
    if any(s == 0 for s in t["shape"]):
        return 0  # an empty tensor is rebuilt without touching memory
    return (sum((n - 1) * abs(s) for n, s in zip(t["shape"], t["stride"])) + 1) * DTYPE_BYTES.get(t["dtype"], 1)


def _output_references(manifest: dict, payload: dict) -> Check:
    region = manifest["region"]
    base, size = region["base"], region["size"]
    problems = []
    if (payload["region"]["base"], payload["region"]["size"]) != (base, size):
        problems.append(f"the manifest's region ({base:#x}, {size}) differs from the payload's "
                        f"({payload['region']['base']:#x}, {payload['region']['size']})")
    count = 0
    for g in manifest["graphs"]:
        for i, t in enumerate(g["outputs"]["tensors"]):
            count += 1
            span = _tensor_span(t)
            if span and not (base <= t["ptr"] and t["ptr"] + span <= base + size):
                problems.append(f"graph {g['name']!r} output {i} at {t['ptr']:#x} (+{span} bytes) lies outside the "
                                f"region [{base:#x}, {base + size:#x})")
    return _result("output references", problems, f"{count} output tensors inside the region")


# ---- one archive, every rank ------------------------------------------------------------------


def verify_one(directory: Path) -> list[Check]:
    """Every check of one (single-rank) archive directory."""
    try:
        manifest: dict | None = read_manifest(directory / MANIFEST_NAME)
        checks = [Check("manifest", OK, f"{len(manifest['graphs'])} graphs listed")]
    except FoundryError as exc:
        manifest = None
        checks = [Check("manifest", FAIL, str(exc))]
    checks += _layout_checks(directory, manifest)
    name = manifest["payload"] if manifest else DEFAULT_PAYLOAD
    payload_check, payload = _payload_check(directory, name) if _plain_name(name, directory) is None else (
        Check("payload", FAIL, "not read: its name is unsafe"), None)
    image_check, images = _image_checks(directory)
    checks += [payload_check, image_check]
    if manifest is None:
        checks.append(Check("fingerprint", SKIPPED, "needs a valid manifest"))
    else:
        checks.append(_fingerprint_check(manifest["fingerprint"]))
    if payload is None or manifest is None:
        checks.append(Check("references", SKIPPED, "needs a valid manifest and payload"))
        return checks
    present = set(image_files(directory))
    checks += [_kernel_references(payload, images, present), _graph_references(manifest, payload),
               _output_references(manifest, payload)]
    return checks


def _root_checks(root: Path, ranks: list[tuple[str | None, Path]]) -> list[Check]:
    """Of a multi-rank root: nothing beside the rank directories (and an engine's engine.json and
    carried caches), none of them a link; the carried caches as the ranks list them."""
    names = {r for r, _ in ranks} | {ENGINE_INFO_NAME, CACHES_DIR}
    problems = [f"unexpected file {e.name}" for e in sorted(root.iterdir()) if e.name not in names]
    problems += [f"{r} is a symbolic link" for r, p in ranks if p.is_symlink()]
    checks = [_result("ranks", problems, f"{len(ranks)} rank archives: {', '.join(str(r) for r, _ in ranks)}")]
    lists = [p / LIST_NAME for _, p in ranks if os.path.lexists(p / LIST_NAME)]  # a link is checked, not skipped
    if lists or (root / CACHES_DIR).exists():
        checks.append(_host_cache_check(root, lists))
    return checks


def _host_cache_check(root: Path, lists: list[Path]) -> Check:
    """Every carried file a rank lists is present, a regular file, with its size and SHA-256;
    nothing else is in ``host_caches/`` but files named by their SHA-256 (those no rank lists, an
    earlier SAVE's, are counted, not failed: LOAD never reads them)."""
    try:
        listed = listed_blobs(lists)
    except FoundryError as exc:
        return Check("host caches", FAIL, str(exc))
    base = root / CACHES_DIR
    if base.is_symlink():
        return Check("host caches", FAIL, f"{CACHES_DIR} is a symbolic link")
    problems = []
    for sha, entry in sorted(listed.items()):
        try:
            if file_digest(base / sha) != entry:
                problems.append(f"{CACHES_DIR}/{sha} differs from its size or SHA-256")
        except OSError as exc:
            problems.append(f"{CACHES_DIR}/{sha}: {exc.strerror or exc}")
    present = sorted(base.iterdir()) if base.is_dir() else []
    problems += [f"unexpected file {CACHES_DIR}/{p.name}" for p in present
                 if not BLOB_NAME.fullmatch(p.name) or p.is_symlink() or not p.is_file()]
    unlisted = len({p.name for p in present if BLOB_NAME.fullmatch(p.name)} - set(listed))
    size = sum(e.size for e in listed.values())
    detail = f"{len(listed)} carried files ({size / 2**20:.1f} MiB), checksums valid" + (
        f"; {unlisted} files no rank lists (LOAD does not read them)" if unlisted else "")
    return _result("host caches", problems, detail)


def verify_archive(path: str | os.PathLike) -> list[Check]:
    """Every check of an archive (each rank's, prefixed with the rank)."""
    root = Path(path)
    try:
        ranks = rank_archives(root)
    except FoundryError as exc:
        return [Check("archive", FAIL, str(exc))]
    if ranks[0][0] is None:
        return verify_one(root)
    checks = _root_checks(root, ranks)
    for rank, directory in ranks:
        if directory.is_symlink():
            continue  # reported above; not followed
        checks += [Check(f"{rank}: {c.name}", c.status, c.detail) for c in verify_one(directory)]
    return checks


def render_checks(checks: list[Check], console: Any) -> None:
    """One line per check: status, name, reason."""
    style = {OK: "green", FAIL: "bold red", SKIPPED: "yellow"}
    width = max(len(c.name) for c in checks)
    for c in checks:
        console.print(f"[{style[c.status]}]{c.status:<7}[/] {c.name:<{width}}  ", end="", soft_wrap=True)
        console.print(c.detail, markup=False, highlight=False, soft_wrap=True)
