"""How an archive's graphs group by topology, as stored and under a looser key.

Stored: the archive's own groups (kernel identity is part of the topology). Looser: the groups
that would form if an exec update could also change which kernel a node runs (the CUDA driver
allows that since 12.0), i.e. with the kernel's image, name and parameter layout left out of the
key. Prints both counts, the nodes each would build as templates, and the largest groups.

Usage: python scripts/archive_groups.py ARCHIVE_RANK_DIR
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from foundry_core.inspect import all_graphs, payload_dump


def _node_key(n: dict) -> str:
    if n["kind"] != "kernel":
        body = {k: v for k, v in n.items() if k in ("kind",)}
        if n["kind"] == "memset":
            body["shape"] = (n["memset"]["element_size"], n["memset"]["height"] > 1)
        if n["kind"] == "memcpy":
            body["shape"] = (n["memcpy"]["height"] > 1, n["memcpy"]["depth"] > 1)
        if n["kind"] == "child_graph":
            body["child"] = n.get("child")
        return json.dumps(body, sort_keys=True)
    k = n["kernel"]
    f = k.get("func", {})
    return json.dumps({"attrs": k.get("attrs"), "cluster": [f.get("required_cluster"), f.get("non_portable_cluster"),
                                                              f.get("cluster_scheduling")]}, sort_keys=True)


def loose_key(g: dict) -> str:
    return json.dumps([[_node_key(n) for n in g["nodes"]], g["edges"], g["children"]], sort_keys=True)


def main() -> None:
    directory = Path(sys.argv[1])
    if not (directory / "manifest.json").exists():
        directory = directory / "rank0"
    manifest = json.loads((directory / "manifest.json").read_text())
    payload = payload_dump(directory / manifest["payload"])
    graphs = list(all_graphs(payload))
    stored = collections.Counter(g["template"] for g in graphs)
    loose = collections.Counter(loose_key(g) for g in graphs)
    size = {loose_key(g): len(g["nodes"]) for g in graphs}
    nodes_stored = sum(len(t["nodes"]) for t in payload["templates"])
    print(f"{len(graphs)} graphs, {sum(len(g['nodes']) for g in graphs)} nodes")
    print(f"stored groups: {len(stored)} (templates hold {nodes_stored} nodes)")
    print(f"groups if kernels were updatable: {len(loose)} (templates would hold {sum(size.values())} nodes)")
    print("largest loose groups (members x nodes):", [(c, size[k]) for k, c in loose.most_common(8)])


if __name__ == "__main__":
    main()
