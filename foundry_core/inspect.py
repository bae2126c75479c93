"""Reading an archive for people: what it holds, summarised or one graph in full.

An archive is a directory (``manifest.json``, ``graphs.fgr``, ``images/*.fimg``,
``alloc_log.json``), or a directory of per-rank archives ``rank0/``, ``rank1/``... Nothing here
needs a GPU: the binary files are read through the native library's pure file readers
(``foundry_payload_dump``, ``foundry_image_file_dump``, ``foundry_container_check``), which
validate them as LOAD would.

``foundry verify`` (verify.py) and ``foundry diff`` (diff.py) build on the views defined here.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundry_core import _native
from foundry_core.errors import NotFoundError
from foundry_core.manifest import MANIFEST_NAME, read_manifest
from foundry_core.sizes import format_size

logger = logging.getLogger("foundry")

IMAGES_DIR = "images"
IMAGE_FILE = re.compile(r"([0-9a-f]{16})\.fimg")
RANK_DIR = re.compile(r"rank(\d+)")
EDGE_TYPES = {0: "full", 1: "programmatic"}
# CollectiveCall::op (csrc/collective/nccl_api.h).
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
# CU_GRAPH_KERNEL_NODE_PORT_*: where in the upstream kernel a dependency triggers.
EDGE_PORTS = {0: "default", 1: "programmatic", 2: "launch-order"}
SUMMARY_GRAPH_ROWS = 20  # graphs listed in the table; --json lists them all
# A kernel's cache preference (func.cache_config: CUfunc_cache, set with cuFuncSetCacheConfig).
CACHE_CONFIG_NAMES = {0: "prefer_none", 1: "prefer_shared", 2: "prefer_l1", 3: "prefer_equal"}
# The kernel-node launch attributes SAVE keeps when they are not zero (CUlaunchAttributeID, cuda.h;
# csrc/graph/reader.cpp), and how their CUlaunchAttributeValue bytes read.
LAUNCH_ATTRIBUTES = {2: "cooperative", 4: "cluster", 5: "cluster_scheduling", 8: "priority",
                     9: "mem_sync_domain_map", 10: "mem_sync_domain", 11: "preferred_cluster"}
MEM_SYNC_DOMAINS = {0: "default", 1: "remote"}


# ---- the native file readers ------------------------------------------------------------------


def _take_string(ptr: ctypes.c_void_p) -> str:
    """The text of a malloc'd string the C API returned, which is then released."""
    try:
        return ctypes.string_at(ptr.value).decode("utf-8")
    finally:
        _native.lib().foundry_free(ptr)


def payload_dump(path: str | os.PathLike) -> dict:
    """The graph payload file as JSON (validated as LOAD reads it); raises FormatError if corrupt."""
    out = ctypes.c_void_p()
    _native.call("foundry_payload_dump", os.fsencode(path), ctypes.byref(out))
    return json.loads(_take_string(out))


def image_file_info(path: str | os.PathLike) -> dict:
    """An image file's metadata, entry names and stored sizes (validated; no image bytes)."""
    out = ctypes.c_void_p()
    _native.call("foundry_image_file_dump", os.fsencode(path), ctypes.byref(out))
    return json.loads(_take_string(out))


def container_sections(path: str | os.PathLike) -> int:
    """Fully validates a section container file (checksums included); returns its section count."""
    sections = ctypes.c_uint32()
    _native.call("foundry_container_check", os.fsencode(path), ctypes.byref(sections))
    return sections.value


# ---- archive layout ---------------------------------------------------------------------------


def rank_archives(path: str | os.PathLike) -> list[tuple[str | None, Path]]:
    """The archives under ``path``: itself (rank None) when it holds a manifest, else its
    ``rankN/`` sub-directories in rank order. Raises NotFoundError when there is neither."""
    root = Path(path)
    if not root.is_dir():
        raise NotFoundError(f"{root}: not an archive directory")
    if (root / MANIFEST_NAME).exists() or (root / MANIFEST_NAME).is_symlink():
        return [(None, root)]
    ranks = []
    for entry in root.iterdir():
        m = RANK_DIR.fullmatch(entry.name)
        if m and entry.is_dir():
            ranks.append((int(m.group(1)), entry.name, entry))
    if not ranks:
        raise NotFoundError(f"{root}: no {MANIFEST_NAME} and no rankN/ sub-directories (is this a Foundry archive?)")
    return [(name, p) for _, name, p in sorted(ranks)]


def image_files(directory: Path) -> dict[str, Path]:
    """Image files by their hash (16 hex digits), from the names under ``images/``."""
    images = directory / IMAGES_DIR
    if not images.is_dir():
        return {}
    found = {}
    for entry in sorted(images.iterdir()):
        m = IMAGE_FILE.fullmatch(entry.name)
        if m:
            found[m.group(1)] = entry
    return found


def disk_size(path: Path) -> int:
    """Bytes of the regular files under path (symbolic links are not followed)."""
    if path.is_file() and not path.is_symlink():
        return path.stat().st_size
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            p = Path(dirpath, name)
            if not p.is_symlink():
                total += p.stat().st_size
    return total


@dataclass
class ArchiveView:
    """One archive (one rank) as read from disk: manifest, payload dump and image metadata."""

    directory: Path
    rank: str | None
    manifest: dict
    payload: dict
    images: dict[str, dict] = field(default_factory=dict)  # hash -> info, or {"error": message}

    @property
    def label(self) -> str:
        return self.rank or str(self.directory)


def open_view(directory: Path, rank: str | None = None) -> ArchiveView:
    """Reads one archive. The manifest and the payload must be valid (FoundryError otherwise);
    an unreadable image file is recorded with its error rather than raised."""
    manifest = read_manifest(directory / MANIFEST_NAME)
    payload = payload_dump(directory / manifest["payload"])
    images: dict[str, dict] = {}
    for h, p in image_files(directory).items():
        try:
            images[h] = image_file_info(p)
        except Exception as exc:  # noqa: BLE001 - any failure is shown, not raised
            images[h] = {"error": str(exc)}
    return ArchiveView(directory, rank, manifest, payload, images)


def open_views(path: str | os.PathLike) -> list[ArchiveView]:
    """Every rank's archive under ``path`` (see rank_archives)."""
    return [open_view(p, rank) for rank, p in rank_archives(path)]


# ---- the graph model, on payload dumps ------------------------------------------------------


def member_graph(payload: dict, index: int) -> dict:
    """Graph ``index`` of a payload dump: its template with the member's delta nodes put in."""
    members = payload["members"]
    if not 0 <= index < len(members):
        raise NotFoundError(f"no graph {index}: the archive holds {len(members)} graphs (0..{len(members) - 1})")
    member = members[index]
    template = payload["templates"][member["template"]]
    nodes = list(template["nodes"])
    for d in member["delta"]:
        nodes[d["node"]] = d["value"]
    return {"name": member["name"], "template": member["template"], "nodes": nodes, "edges": template["edges"],
            "children": template["children"]}


def walk_nodes(graph: dict) -> Iterator[dict]:
    """Every node of a graph, child graphs' nodes included, in order."""
    for n in graph["nodes"]:
        yield n
    for c in graph["children"]:
        yield from walk_nodes(c)


def all_graphs(payload: dict) -> Iterator[dict]:
    """Every graph of a payload with its delta applied."""
    for i in range(len(payload["members"])):
        yield member_graph(payload, i)


def stored_kernels(payload: dict) -> Iterator[tuple[str, dict]]:
    """(where, kernel) for every kernel stored in a payload: template nodes, child graphs and
    delta nodes, so that a kernel only a delta names is seen too."""
    def in_graph(g: dict, where: str) -> Iterator[tuple[str, dict]]:
        for i, n in enumerate(g["nodes"]):
            if n["kind"] == "kernel":
                yield f"{where} node {i}", n["kernel"]
        for c, child in enumerate(g["children"]):
            yield from in_graph(child, f"{where} child {c}")

    for t, template in enumerate(payload["templates"]):
        yield from in_graph(template, f"template {t}")
    for m, member in enumerate(payload["members"]):
        for d in member["delta"]:
            if d["value"]["kind"] == "kernel":
                yield f"graph {m} ({member['name']}) delta node {d['node']}", d["value"]["kernel"]


# ---- summary ----------------------------------------------------------------------------------


def summarize_view(view: ArchiveView) -> dict:
    """What `foundry inspect` shows for one archive, as plain data."""
    payload = view.payload
    nodes_by_kind: Counter[str] = Counter()
    kernels_by_image: Counter[str] = Counter()
    collectives: Counter[tuple[str, int, int, int]] = Counter()
    graphs = []
    for g in all_graphs(payload):
        count = 0
        for n in walk_nodes(g):
            count += 1
            nodes_by_kind[n["kind"]] += 1
            if n["kind"] == "kernel":
                kernels_by_image[n["kernel"]["image"]] += 1
            elif n["kind"] == "collective":
                for call in n["collective"]["calls"]:
                    collectives[(collective_op(call["op"]), call["comm"], call["nranks"], call["rank"])] += 1
        graphs.append({"name": g["name"], "template": g["template"], "nodes": count})
    for g, member in zip(graphs, payload["members"]):
        g["delta_nodes"] = len(member["delta"])
    images = [_image_row(h, info, view.directory) for h, info in sorted(view.images.items())]
    by_image = []
    for h, n in sorted(kernels_by_image.items(), key=lambda kv: (-kv[1], kv[0])):
        info = view.images.get(h, {})
        by_image.append({"image": h, "kernel_nodes": n, "kind": info.get("kind_name"), "size": info.get("size")})
    m = view.manifest
    return {
        "rank": view.rank,
        "path": str(view.directory),
        "fingerprint": m["fingerprint"],
        "created": m.get("created"),
        "graph_count": len(graphs),
        "groups": len(payload["templates"]),
        "graphs": graphs,
        "nodes_by_kind": dict(sorted(nodes_by_kind.items())),
        "kernels_by_image": by_image,
        "collectives": [{"op": op, "comm": comm, "nranks": nranks, "rank": rank, "calls": n}
                        for (op, comm, nranks, rank), n in sorted(collectives.items())],
        "images": images,
        "region": {"base": m["region"]["base"], "size": m["region"]["size"], "high_water": m["region"]["high_water"]},
        "payload_size": disk_size(view.directory / m["payload"]),
        "archive_size": disk_size(view.directory),
    }


def _image_row(h: str, info: dict, directory: Path) -> dict:
    row: dict[str, Any] = {"hash": h, "file_size": disk_size(directory / IMAGES_DIR / f"{h}.fimg")}
    if "error" in info:
        row["error"] = info["error"]
        return row
    row.update(kind=info["kind_name"], loader=info["loader"], size=info["size"], stored_size=info["stored_size"],
               entries=len(info["entries"]), arch=info["arch"], nvshmem=info["nvshmem"])
    return row


def summarize(path: str | os.PathLike) -> dict:
    """The summary of an archive directory, one entry per rank."""
    return {"path": str(Path(path)), "ranks": [summarize_view(v) for v in open_views(path)]}


# ---- graph detail -----------------------------------------------------------------------------


def demangle(names: list[str]) -> dict[str, str]:
    """Readable C++ names via c++filt when it is installed; names map to themselves otherwise."""
    unique = sorted(set(names))
    tool = shutil.which("c++filt")
    if not unique or tool is None:
        return {n: n for n in unique}
    try:
        out = subprocess.run([tool], input="\n".join(unique) + "\n", capture_output=True, text=True, timeout=30,
                             check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        logger.debug("c++filt failed (%s); showing mangled names", exc)
        return {n: n for n in unique}
    if len(out) != len(unique):
        return {n: n for n in unique}
    return dict(zip(unique, out))


def resolve_graph_index(payload: dict, which: str) -> int:
    """A graph index from what the user typed: an index, or a graph name."""
    names = [m["name"] for m in payload["members"]]
    if which.isdigit():
        return int(which)
    if which in names:
        return names.index(which)
    raise NotFoundError(f"no graph named {which!r} (graphs: {', '.join(names[:10])}{'...' if len(names) > 10 else ''})")


def graph_detail(view: ArchiveView, index: int) -> dict:
    """Graph ``index`` in full (delta applied), with each kernel's demangled name."""
    g = member_graph(view.payload, index)
    names = demangle([n["kernel"]["name"] for n in walk_nodes(g) if n["kind"] == "kernel"])

    def annotate(graph: dict) -> dict:
        nodes = []
        for n in graph["nodes"]:
            if n["kind"] == "kernel":
                n = {**n, "kernel": {**n["kernel"], "demangled": names[n["kernel"]["name"]]}}
            nodes.append(n)
        return {**graph, "nodes": nodes, "children": [annotate(c) for c in graph["children"]]}

    return {"rank": view.rank, "index": index, **annotate(g)}


def cache_config_name(value: int) -> str:
    """A kernel's CUfunc_cache by name (func.cache_config in the payload dump)."""
    return CACHE_CONFIG_NAMES.get(value, f"cache config {value}")


def kernel_cache_config(k: dict) -> int:
    """The cache preference of a kernel of a payload dump (0, prefer_none, when not recorded)."""
    return k.get("func", {}).get("cache_config", 0)


def collective_op(op: int) -> str:
    return COLLECTIVE_OPS[op] if 0 <= op < len(COLLECTIVE_OPS) else f"op {op}"


def _dim(v: list[int]) -> str:
    return "x".join(str(x) for x in v)


def describe_launch_attribute(attr: dict) -> str:
    """A kernel node's launch attribute as ``name=value`` (``priority=-1``, ``cluster=2x1x1``)."""
    raw = bytes.fromhex(attr["value"])

    def word(i: int, signed: bool = False) -> int:
        return int.from_bytes(raw[4 * i:4 * i + 4], "little", signed=signed)

    ident = attr["id"]
    if ident in (4, 11):
        value = _dim([word(0), word(1), word(2)])
    elif ident == 9:
        value = f"default:{raw[0]},remote:{raw[1]}"
    elif ident == 10:
        value = MEM_SYNC_DOMAINS.get(word(0), str(word(0)))
    else:
        value = str(word(0, signed=True))
    return f"{LAUNCH_ATTRIBUTES.get(ident, f'attribute{ident}')}={value}"


def describe_node(n: dict) -> str:
    """One node on one line: its kind, then what it does."""
    kind = n["kind"]
    if kind == "kernel":
        k = n["kernel"]
        # The cache preference only when the kernel has one: most keep the driver's default.
        cache = f" cache={cache_config_name(kernel_cache_config(k))}" if kernel_cache_config(k) else ""
        attrs = "".join(f" {describe_launch_attribute(a)}" for a in k.get("attrs", ()))
        return (f"kernel  {k.get('demangled', k['name'])}  grid={_dim(k['grid'])} block={_dim(k['block'])} "
                f"smem={k['shared_mem']}{cache}{attrs}  image={k['image']}")
    if kind == "memset":
        m = n["memset"]
        return (f"memset  dst={m['dst']:#x} value={m['value']:#x} element={m['element_size']}B "
                f"width={m['width']} height={m['height']} pitch={m['pitch']}")
    if kind == "memcpy":
        m = n["memcpy"]
        return (f"memcpy  src={m['src']:#x} dst={m['dst']:#x} extent={m['width']}x{m['height']}x{m['depth']} "
                f"src_pitch={m['src_pitch']} dst_pitch={m['dst_pitch']}")
    if kind in ("event_record", "event_wait"):
        return f"{kind}  event {n['event']}"
    if kind == "child_graph":
        return f"child_graph  child {n['child']}"
    if kind == "collective":
        c = n["collective"]
        calls = ", ".join(f"{collective_op(x['op'])} of {x['count']} (dtype {x['dtype']}) send={x['send']:#x} "
                          f"recv={x['recv']:#x} comm {x['comm']} rank {x['rank']}/{x['nranks']}" for x in c["calls"])
        return f"collective  NCCL {calls}  kernel {c['kernel']}: {c.get('demangled', c['name'])}"
    return kind


def describe_edge(e: dict) -> str:
    kind = EDGE_TYPES.get(e["type"], f"type {e['type']}")
    text = f"{e['from']} -> {e['to']}  {kind}"
    if e["from_port"] or e["to_port"]:
        text += (f"  (port {EDGE_PORTS.get(e['from_port'], e['from_port'])}"
                 f" -> {EDGE_PORTS.get(e['to_port'], e['to_port'])})")
    return text


def graph_lines(graph: dict, indent: str = "") -> list[str]:
    """The readable listing of a graph: nodes, then edges, then each child graph."""
    lines = [f"{indent}nodes ({len(graph['nodes'])}):"]
    width = len(str(max(len(graph["nodes"]) - 1, 0)))
    lines += [f"{indent}  {i:>{width}}  {describe_node(n)}" for i, n in enumerate(graph["nodes"])]
    lines.append(f"{indent}edges ({len(graph['edges'])}):")
    lines += [f"{indent}  {describe_edge(e)}" for e in graph["edges"]]
    for c, child in enumerate(graph["children"]):
        lines.append(f"{indent}child graph {c}:")
        lines += graph_lines(child, indent + "    ")
    return lines


# ---- rendering (rich) -------------------------------------------------------------------------


def human_size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n} B" if n < 1024 else f"{format_size(n)} ({n} B)"


def render_summary(summary: dict, console: Any) -> None:
    """Prints the summary tables of every rank."""
    for rank in summary["ranks"]:
        _render_rank(rank, console)


def _render_rank(s: dict, console: Any) -> None:
    from rich.table import Table

    title = f"archive {s['path']}" + (f" ({s['rank']})" if s["rank"] else "")
    t = Table(title=title, show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for key, value in sorted(s["fingerprint"].items()):
        t.add_row(f"fingerprint.{key}", str(value))
    if s["created"]:
        t.add_row("created", str(s["created"]))
    t.add_row("graphs", str(s["graph_count"]))
    t.add_row("groups", str(s["groups"]))
    region = s["region"]
    t.add_row("region base", f"{region['base']:#x}")
    t.add_row("region size", human_size(region["size"]))
    t.add_row("region high-water", human_size(region["high_water"]))
    t.add_row("payload size", human_size(s["payload_size"]))
    t.add_row("archive size", human_size(s["archive_size"]))
    console.print(t)
    console.print(_table("nodes by type", ["type", "count"],
                         [[k, str(v)] for k, v in s["nodes_by_kind"].items()]))
    console.print(_table("kernels by image", ["image", "kernel nodes", "kind", "size"],
                         [[r["image"], str(r["kernel_nodes"]), r["kind"] or "missing", human_size(r["size"])]
                          for r in s["kernels_by_image"]]))
    if s["collectives"]:
        console.print(_table("NCCL collectives (LOAD makes these calls again)",
                             ["operation", "communicator", "rank", "calls"],
                             [[c["op"], str(c["comm"]), f"{c['rank']} of {c['nranks']}", str(c["calls"])]
                              for c in s["collectives"]]))
    console.print(_table("images", ["hash", "kind", "loader", "size", "file size", "entries"],
                         [[r["hash"], r.get("kind", "unreadable"), r.get("loader", "-"), human_size(r.get("size")),
                           human_size(r["file_size"]), str(r.get("entries", "-"))] for r in s["images"]]))
    rows = [[str(i), g["name"], str(g["template"]), str(g["nodes"]), str(g["delta_nodes"])]
            for i, g in enumerate(s["graphs"][:SUMMARY_GRAPH_ROWS])]
    if len(s["graphs"]) > SUMMARY_GRAPH_ROWS:
        rows.append(["...", f"{len(s['graphs']) - SUMMARY_GRAPH_ROWS} more (--json lists all)", "", "", ""])
    console.print(_table("graphs", ["#", "name", "group", "nodes", "changed nodes"], rows))


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


def render_graph(detail: dict, console: Any) -> None:
    """Prints one graph in full, one line per node and per edge."""
    where = f"{detail['rank']}: " if detail["rank"] else ""
    console.print(f"{where}graph {detail['index']} {detail['name']!r} (group {detail['template']})",
                  markup=False, highlight=False, soft_wrap=True)
    for line in graph_lines(detail):
        console.print(line, markup=False, highlight=False, soft_wrap=True)

