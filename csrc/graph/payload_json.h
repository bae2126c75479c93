// A graph payload (graphs.fgr) as readable JSON, and back.
//
// payload_to_json writes every field of the model; payload_from_json is its exact inverse and
// checks what read_payload checks (so a document it accepts makes a payload LOAD would read), which
// lets tests build synthetic archives without a GPU. Layout:
//
//   {"version": 3, "region": {"base": u64, "size": u64}, "event_count": u32,
//    "templates": [graph...], "members": [member...]}
//   graph  := {"nodes": [node...], "edges": [edge...], "children": [graph...]}
//   edge   := {"from": u32, "to": u32, "from_port": u8, "to_port": u8, "type": u8}
//   node   := {"kind": "kernel", "kernel": kernel} | {"kind": "memset", "memset": {...}}
//           | {"kind": "memcpy", "memcpy": {...}} | {"kind": "event_record" | "event_wait", "event": u32}
//           | {"kind": "empty"} | {"kind": "child_graph", "child": u32}
//   kernel := {"image": "<16 hex digits>", "name": str, "grid": [u32 x3], "block": [u32 x3],
//              "shared_mem": u32, "params": "<hex>", "slots": [{"offset", "size"}...],
//              "attrs": [{"id": u32, "value": "<hex>"}...],
//              "func": {"max_dynamic_shared", "preferred_carveout", "required_cluster": [i32 x3],
//                       "non_portable_cluster", "cluster_scheduling", "cache_config"}}
//   member := {"name": str, "template": u32, "delta": [{"node": u32, "value": node}...],
//              "refs": [{"offset": u64, "size": u64, "kind": u32}...]}
//
// "cache_config" is the kernel's CUfunc_cache (0 none, 1 shared, 2 L1, 3 equal), the same in every
// node of one kernel (the file stores it once per kernel). Version 2 documents, written before it,
// are read without it (PREFER_NONE).
//
// Integers are JSON integers, kept exact (addresses exceed 2^53). Reading refuses a missing,
// mistyped or unknown field with FOUNDRY_ERR_FORMAT naming its path (e.g.
// "templates[0].nodes[3].kernel.grid[1]").
#pragma once

#include <string>

#include "common/status.h"
#include "graph/payload.h"

namespace foundry {

std::string payload_to_json(const Payload& p);
Result<Payload> payload_from_json(const std::string& text);

}  // namespace foundry
