"""Whether a start compiled anything: every file now in the caches an archive's rank 0 carried
(Triton's, FlashInfer's, tvm-ffi's, at the roots its list names) must be one the list names, with
its bytes (and its file time where the list has one). Run after a LOAD on emptied caches.

Usage: python scripts/carried_caches_check.py ARCHIVE     (exit 1 when a file was compiled or changed)
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def _skipped(rel: str) -> bool:
    # Lock files and FlashInfer's log are written by every start, compiling or not.
    return Path(rel).name in ("lock", "flashinfer_jit.log") or rel.endswith(".lock") or "/cached_ops/tmp/" in f"/{rel}"


def check(archive: Path) -> tuple[int, list[str]]:
    listed = json.loads((archive / "rank0" / "host_caches.json").read_text())
    checked, problems = 0, []
    for cache, root in listed.get("roots", {}).items():
        files = listed["caches"].get(cache, {})
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            if _skipped(rel):
                continue
            entry = files.get(rel)
            if entry is None:
                problems.append(f"{cache}: {rel} (not in the archive: compiled by this start)")
                continue
            checked += 1
            if not path.name.startswith("__grp__") and hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
                problems.append(f"{cache}: {rel} (other bytes)")
            elif "mtime_ns" in entry and path.stat().st_mtime_ns != entry["mtime_ns"]:
                problems.append(f"{cache}: {rel} (rewritten: its file time differs)")
    return checked, problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    checked, problems = check(Path(argv[0]))
    print(f"{checked} files from the archive; {len(problems)} compiled or changed by this start")
    for line in problems:
        print("  ", line)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
