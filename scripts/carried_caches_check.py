"""Whether a start compiled anything: every file now in the caches an archive's rank 0 carried
(Triton's, FlashInfer's, tvm-ffi's, at the roots its list names) must be one the list names, with
its bytes (and its file time where the list has one). Run after a LOAD on emptied caches.
``--at CACHE=DIR`` checks only the caches it names, each at its DIR (a LOAD whose caches were at
other paths than the saving host's: a new host).

Usage: python scripts/carried_caches_check.py ARCHIVE [--at CACHE=DIR]...   (exit 1 when a file was compiled or changed)
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def _skipped(rel: str) -> bool:
    # Lock files and FlashInfer's log are written by every start, compiling or not.
    return Path(rel).name in ("lock", "flashinfer_jit.log") or rel.endswith(".lock") or "/cached_ops/tmp/" in f"/{rel}"


def check(archive: Path, at: dict[str, str] | None = None) -> tuple[int, list[str]]:
    listed = json.loads((archive / "rank0" / "host_caches.json").read_text())
    unknown = sorted(set(at or {}) - set(listed["caches"]))
    if unknown:
        raise ValueError(f"the archive carries no cache named {', '.join(unknown)} "
                         f"(it carries {', '.join(sorted(listed['caches'])) or 'none'})")
    roots: dict[str, dict[str, tuple[str, dict]]] = {}  # root -> rel -> (cache, entry): caches may share a root
    for cache, root in (at or listed.get("roots", {})).items():
        files = roots.setdefault(root, {})
        files.update({rel: (cache, entry) for rel, entry in listed["caches"].get(cache, {}).items()})
    checked, problems = 0, []
    for root, files in roots.items():
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            if _skipped(rel):
                continue
            cache, entry = files.get(rel, (None, None))
            if entry is None:
                problems.append(f"{root}: {rel} (not in the archive: compiled by this start)")
                continue
            checked += 1
            if not path.name.startswith("__grp__") and hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
                problems.append(f"{cache}: {rel} (other bytes)")
            elif "mtime_ns" in entry and path.stat().st_mtime_ns != entry["mtime_ns"]:
                problems.append(f"{cache}: {rel} (rewritten: its file time differs)")
    return checked, problems


def main(argv: list[str]) -> int:
    at = dict(a.partition("=")[::2] for a in argv[2::2]) if argv[1::2] == ["--at"] * len(argv[2::2]) else None
    if len(argv) % 2 != 1 or at is None or not all(at.values()):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        checked, problems = check(Path(argv[0]), at)
    except ValueError as exc:
        print(f"carried_caches_check: {exc}", file=sys.stderr)
        return 2
    print(f"{checked} files from the archive; {len(problems)} compiled or changed by this start")
    for line in problems:
        print("  ", line)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
