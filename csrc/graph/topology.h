// Topology grouping: graphs that differ only in what LOAD writes into a template's CUgraph nodes
// before instantiating share one template in an archive; each other member is stored as a delta
// of changed nodes.
//
// The topology of a graph is what stays the template's: node count and kinds; per kernel its
// launch attributes and cluster-related function attributes; memset element size and 1D/2D
// shape; memcpy 1D/2D/3D shape; child graphs in full; and every edge with its ports and type.
// Which kernel runs (image, entry name, parameter layout), parameter bytes, grid, block, shared
// memory, pointers, sizes and event indices are per member and so are left out.
#pragma once

#include <cstdint>
#include <vector>

#include "archive/bytes.h"
#include "common/status.h"
#include "graph/model.h"

namespace foundry {

// A hash (XXH64) of the topology: equal topologies give equal keys.
uint64_t topology_key(const GraphModel& g);
// The exact comparison behind topology_key (no hashing): true when a and b can share a template.
bool same_topology(const GraphModel& a, const GraphModel& b);

// Full equality of two models, children included.
bool models_equal(const GraphModel& a, const GraphModel& b);

// One node of a member graph that differs from its template, by index into the template's nodes.
struct NodeDelta {
  uint32_t node;
  Node value;
};

// The nodes of `member` that differ from `tmpl` in any field, in node order.
// Precondition: same_topology(tmpl, member).
std::vector<NodeDelta> make_delta(const GraphModel& tmpl, const GraphModel& member);
// The member: tmpl with each delta node replaced. Refuses (FOUNDRY_ERR_FORMAT, *out untouched) a
// node index outside tmpl, a node whose kind differs from the template's, and a child graph index
// outside tmpl's children.
Status apply_delta(const GraphModel& tmpl, const std::vector<NodeDelta>& d, GraphModel* out);

// The delta encoding lives in serialize.h (write_delta / read_delta, relative to the template).

struct Grouping {
  std::vector<uint32_t> template_of;  // per graph: index of its group's template graph
  std::vector<uint32_t> templates;    // graph indices that are templates, in first-appearance order
};

// Groups graphs by topology_key, each membership confirmed with the exact comparison (a hash
// collision between different topologies starts a new group). The first graph of a group is its
// template. All pointers must be non-null.
Grouping group_graphs(const std::vector<const GraphModel*>& graphs);

}  // namespace foundry
