"""Compares PyTorch's cached segments after each prefill shape at SAVE and at LOAD.

Reads the JSON lines FOUNDRY_SGLANG_PREFILL_TRACE wrote (one per shape and start, labelled
``save <shape>`` / ``load <shape>``) and prints, for the first shape where they differ, the
segments only one side holds (address, size, pool, blocks in use): the block that makes a LOAD's
prefill placements diverge from SAVE's.

Usage: python scripts/prefill_trace_diff.py TRACE.jsonl
"""

from __future__ import annotations

import json
import sys


def _segments(entry: dict) -> dict[tuple[int, int, str], list]:
    return {(s["address"], s["size"], s["pool"]): s["blocks"] for s in entry["segments"]}


def _show(key: tuple[int, int, str], blocks: list) -> str:
    used = [block for block in blocks if block[1] != "inactive"]
    lines = [f"  {key[0]:#x} +{key[1]:#x} pool {key[2]}: {len(used)} of {len(blocks)} blocks in use "
             f"({sum(block[0] for block in used)} bytes)"]
    lines += [f"      {block[0]:>10} {block[1]:<18} {block[2] if len(block) > 2 else ''}" for block in blocks[:12]]
    return "\n".join(lines)


def main(path: str) -> int:
    by_label: dict[str, dict] = {}
    order: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            side, _, shape = entry["label"].partition(" ")
            if shape not in order:
                order.append(shape)
            by_label[f"{side} {shape}"] = entry
    for shape in order:
        save, load = by_label.get(f"save {shape}"), by_label.get(f"load {shape}")
        if save is None or load is None:
            continue
        s, l = _segments(save), _segments(load)
        only_save = sorted(set(s) - set(l))
        only_load = sorted(set(l) - set(s))
        if only_save or only_load:
            print(f"after {shape}: {len(only_save)} segments only at SAVE, {len(only_load)} only at LOAD")
            for key in only_save:
                print("SAVE" + _show(key, s[key]))
            for key in only_load:
                print("LOAD" + _show(key, l[key]))
            return 1
    print(f"PyTorch's segments agree after all {len(order)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
