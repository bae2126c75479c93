"""Helpers shared by the GPU test programs (each runs in its own fresh process)."""

from __future__ import annotations

import json
import sys

REGION_BASE = 0x6000_0000_0000
REGION_SIZE = 256 << 30


def emit(result: dict) -> None:
    """Prints the program's result as one JSON line (the test reads the last one)."""
    print(json.dumps(result), flush=True)
    sys.stdout.flush()


def log_to_json(entries) -> list[dict]:
    return [{"seq": e.seq, "kind": e.kind, "offset": e.offset, "size": e.size, "tag": e.tag} for e in entries]


def log_from_json(items) -> list:
    from foundry_core.region import LogEntry

    return [LogEntry(i["seq"], i["kind"], i["offset"], i["size"], i.get("tag", "")) for i in items]
