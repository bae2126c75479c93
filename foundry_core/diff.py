"""`foundry diff A B`: how two archives differ, in the terms that matter for LOAD.

Compared: fingerprint fields, graphs present in one archive only, the number of groups
(templates), per graph its topology (node count, node kinds, kernel name sequence, edges) and
parameters, the kernels (image hash, name) each archive uses and the cache preference each kernel
is restored with, and the images each holds. For per-rank archives, ranks are paired by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from foundry_core.inspect import (ArchiveView, all_graphs, cache_config_name, kernel_cache_config, open_views,
                                  stored_kernels, walk_nodes)

MAX_LISTED = 10  # items named per difference line


@dataclass
class Difference:
    where: str  # "fingerprint", "graphs", "groups", "graph 'bs=8'", "kernels", "images", "ranks"
    detail: str


def _names(items: list[str]) -> str:
    more = f", ... ({len(items) - MAX_LISTED} more)" if len(items) > MAX_LISTED else ""
    return ", ".join(items[:MAX_LISTED]) + more


def _only(where: str, a: set, b: set, show: Any = str) -> list[Difference]:
    out = []
    if a - b:
        out.append(Difference(where, f"only in A: {_names(sorted(show(x) for x in a - b))}"))
    if b - a:
        out.append(Difference(where, f"only in B: {_names(sorted(show(x) for x in b - a))}"))
    return out


def _fingerprint(a: dict, b: dict) -> list[Difference]:
    return [Difference("fingerprint", f"{k}: {a.get(k)!r} (A) vs {b.get(k)!r} (B)")
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _kernel_names(graph: dict) -> list[str]:
    return [n["kernel"]["name"] for n in walk_nodes(graph) if n["kind"] == "kernel"]


def _first_difference(x: list, y: list) -> int:
    for i, (p, q) in enumerate(zip(x, y)):
        if p != q:
            return i
    return min(len(x), len(y))


def _graph(name: str, ga: dict, gb: dict) -> list[Difference]:
    """Topology first (what decides whether a graph can be restored the same way), then values."""
    where = f"graph {name!r}"
    na, nb = list(walk_nodes(ga)), list(walk_nodes(gb))
    out = []
    if len(na) != len(nb):
        out.append(Difference(where, f"{len(na)} nodes (A) vs {len(nb)} nodes (B)"))
    kinds_a, kinds_b = [n["kind"] for n in na], [n["kind"] for n in nb]
    if kinds_a != kinds_b and len(na) == len(nb):
        i = _first_difference(kinds_a, kinds_b)
        out.append(Difference(where, f"node kinds differ from node {i}: {kinds_a[i]} (A) vs {kinds_b[i]} (B)"))
    ka, kb = _kernel_names(ga), _kernel_names(gb)
    if ka != kb:
        i = _first_difference(ka, kb)
        at_a = ka[i] if i < len(ka) else "(end)"
        at_b = kb[i] if i < len(kb) else "(end)"
        out.append(Difference(where, f"kernel sequences differ from kernel {i}: {at_a} (A) vs {at_b} (B)"))
    if ga["edges"] != gb["edges"] or ga["children"] != gb["children"]:
        out.append(Difference(where, f"edges or child graphs differ ({len(ga['edges'])} vs {len(gb['edges'])} edges)"))
    if not out and na != nb:
        changed = [i for i, (p, q) in enumerate(zip(na, nb)) if p != q]
        out.append(Difference(where, f"same topology, parameters differ at {len(changed)} nodes "
                                     f"({_names([str(i) for i in changed])})"))
    return out


def _kernels(view: ArchiveView) -> set[tuple[str, str]]:
    return {(k["image"], k["name"]) for _, k in stored_kernels(view.payload)}


def _cache_configs(view: ArchiveView) -> dict[tuple[str, str], int]:
    return {(k["image"], k["name"]): kernel_cache_config(k) for _, k in stored_kernels(view.payload)}


def _cache_config_changes(a: ArchiveView, b: ArchiveView) -> list[Difference]:
    """Kernels both archives use, restored with another L1/shared preference (cuFuncSetCacheConfig)."""
    ca, cb = _cache_configs(a), _cache_configs(b)
    changed = sorted(k for k in ca.keys() & cb.keys() if ca[k] != cb[k])
    return [Difference("kernels", f"cache preference of {image}:{name}: {cache_config_name(ca[(image, name)])} (A) "
                                  f"vs {cache_config_name(cb[(image, name)])} (B)") for image, name in changed]


def diff_views(a: ArchiveView, b: ArchiveView) -> list[Difference]:
    """Differences between two single-rank archives."""
    out = _fingerprint(a.manifest["fingerprint"], b.manifest["fingerprint"])
    graphs_a = {g["name"]: g for g in all_graphs(a.payload)}
    graphs_b = {g["name"]: g for g in all_graphs(b.payload)}
    out += _only("graphs", set(graphs_a), set(graphs_b), repr)
    ta, tb = len(a.payload["templates"]), len(b.payload["templates"])
    if ta != tb:
        out.append(Difference("groups", f"{ta} (A) vs {tb} (B)"))
    for name in [n for n in graphs_a if n in graphs_b]:
        out += _graph(name, graphs_a[name], graphs_b[name])
    out += _only("kernels", _kernels(a), _kernels(b), lambda k: f"{k[0]}:{k[1]}")
    out += _cache_config_changes(a, b)
    out += _only("images", set(a.images), set(b.images))
    return out


def diff_archives(path_a: str | os.PathLike, path_b: str | os.PathLike) -> list[Difference]:
    """Differences between two archives (each rank's, prefixed with the rank). Raises
    FoundryError when either cannot be read."""
    views_a = {v.rank: v for v in open_views(path_a)}
    views_b = {v.rank: v for v in open_views(path_b)}
    out = _only("ranks", {r or "(top level)" for r in views_a}, {r or "(top level)" for r in views_b})
    for rank in [r for r in views_a if r in views_b]:
        for d in diff_views(views_a[rank], views_b[rank]):
            out.append(Difference(f"{rank}: {d.where}" if rank else d.where, d.detail))
    return out


def render_diff(diffs: list[Difference], a: str, b: str, console: Any) -> None:
    console.print(f"A: {a}\nB: {b}", markup=False, highlight=False, soft_wrap=True)
    if not diffs:
        console.print("identical (fingerprint, graphs, groups, topologies, parameters, kernels, cache preferences, "
                      "images)",
                      markup=False, highlight=False, soft_wrap=True)
        return
    for d in diffs:
        console.print(f"{d.where}: {d.detail}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"{len(diffs)} differences", markup=False, highlight=False, soft_wrap=True)
