#include "graph/topology.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/hash.h"
#include "graph/serialize.h"

namespace foundry {
namespace {

// ---- topology encoding ----
//
// The topology is written as an unambiguous byte string (every variable-length part carries its
// length), so two graphs have the same topology exactly when their encodings are equal: the key
// hashes the encoding and same_topology compares it, and the two can never disagree.

// Which kernel a node runs and its parameter layout are not topology: LOAD writes each member's
// kernel into the template's CUgraph node (cuGraphKernelNodeSetParams) before instantiating, and
// graphs of different batch sizes often differ only in the GEMM kernel chosen.
void encode_kernel_topology(ByteWriter& w, const KernelNode& k) {
  // Node attributes (cluster dimensions, priorities, ...) are kept out of the delta encoding.
  w.u32(static_cast<uint32_t>(k.attrs.size()));
  for (const LaunchAttr& a : k.attrs) {
    w.u32(a.id);
    w.blob(a.value.data(), a.value.size());
  }
  // Cluster shape is fixed at instantiation. The shared memory attributes are not topology: LOAD
  // sets each function's once, to the most any graph asks.
  for (int32_t v : k.func.required_cluster) w.u32(static_cast<uint32_t>(v));
  w.u32(static_cast<uint32_t>(k.func.non_portable_cluster));
  w.u32(static_cast<uint32_t>(k.func.cluster_scheduling));
}

void encode_node_topology(ByteWriter& w, const Node& n) {
  w.u32(static_cast<uint32_t>(n.kind));
  switch (n.kind) {
    case NodeKind::kKernel:
      encode_kernel_topology(w, n.kernel);
      break;
    case NodeKind::kMemset:
      // Kept as topology (exec updates cannot change them; graphs rarely differ in them).
      w.u32(n.memset.element_size);
      w.u8(n.memset.height > 1);
      break;
    case NodeKind::kMemcpy:
      w.u8(n.memcpy.height > 1);
      w.u8(n.memcpy.depth > 1);
      break;
    case NodeKind::kEventRecord:
    case NodeKind::kEventWait:
    case NodeKind::kEmpty:
      break;  // which event is per member: the kind is all
    case NodeKind::kChildGraph:
      w.u32(n.child);
      break;
    case NodeKind::kCollective:
      // LOAD sets each member's NCCL kernel before instantiation, so only the slot is topology.
      w.u32(n.collective.kernel);
      break;
  }
}

std::vector<uint8_t> topology_bytes(const GraphModel& g) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(g.nodes.size()));
  for (const Node& n : g.nodes) encode_node_topology(w, n);
  // Every edge field: a programmatic edge and a full one are different graphs.
  w.u32(static_cast<uint32_t>(g.edges.size()));
  for (const Edge& e : g.edges) {
    w.u32(e.from);
    w.u32(e.to);
    w.u8(e.from_port);
    w.u8(e.to_port);
    w.u8(e.type);
  }
  // Child graphs cannot be updated piecemeal: members must carry identical ones, so their full
  // serialization is part of the topology.
  w.u32(static_cast<uint32_t>(g.children.size()));
  for (const GraphModel& c : g.children) {
    ByteWriter child;
    write_graph(child, c);
    w.blob(child.bytes().data(), child.size());
  }
  return w.take();
}

uint64_t key_of(const std::vector<uint8_t>& topology) {
  Hasher64 h;
  h.update(topology.data(), topology.size());
  return h.digest();
}

// ---- full equality (only the fields that belong to the node's kind) ----

bool attrs_equal(const std::vector<LaunchAttr>& a, const std::vector<LaunchAttr>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].id != b[i].id || a[i].value != b[i].value) return false;
  return true;
}

bool slots_equal(const std::vector<ParamSlot>& a, const std::vector<ParamSlot>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].offset != b[i].offset || a[i].size != b[i].size) return false;
  return true;
}

// cache_config is left out: it belongs to the kernel, not the node, and the node encoding does not
// carry it (the payload's table does), so a decoded node must compare equal to the one written.
bool func_equal(const FunctionAttrs& a, const FunctionAttrs& b) {
  return a.max_dynamic_shared == b.max_dynamic_shared && a.preferred_carveout == b.preferred_carveout &&
         a.required_cluster[0] == b.required_cluster[0] && a.required_cluster[1] == b.required_cluster[1] &&
         a.required_cluster[2] == b.required_cluster[2] && a.non_portable_cluster == b.non_portable_cluster &&
         a.cluster_scheduling == b.cluster_scheduling;
}

bool kernels_equal(const KernelNode& a, const KernelNode& b) {
  return a.image_hash == b.image_hash && a.name == b.name && std::memcmp(a.grid, b.grid, sizeof a.grid) == 0 &&
         std::memcmp(a.block, b.block, sizeof a.block) == 0 && a.shared_mem == b.shared_mem &&
         a.params == b.params && slots_equal(a.slots, b.slots) && attrs_equal(a.attrs, b.attrs) &&
         func_equal(a.func, b.func);
}

bool memsets_equal(const MemsetNode& a, const MemsetNode& b) {
  return a.dst == b.dst && a.pitch == b.pitch && a.value == b.value && a.element_size == b.element_size &&
         a.width == b.width && a.height == b.height;
}

bool memcpys_equal(const MemcpyNode& a, const MemcpyNode& b) {
  return a.src == b.src && a.dst == b.dst && a.src_x == b.src_x && a.src_y == b.src_y && a.src_z == b.src_z &&
         a.src_pitch == b.src_pitch && a.src_height == b.src_height && a.dst_x == b.dst_x &&
         a.dst_y == b.dst_y && a.dst_z == b.dst_z && a.dst_pitch == b.dst_pitch &&
         a.dst_height == b.dst_height && a.width == b.width && a.height == b.height && a.depth == b.depth;
}

bool calls_equal(const CollectiveCall& a, const CollectiveCall& b) {
  return a.op == b.op && a.comm == b.comm && a.send == b.send && a.recv == b.recv && a.count == b.count &&
         a.dtype == b.dtype && a.redop == b.redop && a.root == b.root && a.nranks == b.nranks && a.rank == b.rank;
}

bool collectives_equal(const CollectiveNode& a, const CollectiveNode& b) {
  return a.name == b.name && a.kernel == b.kernel &&
         std::equal(a.calls.begin(), a.calls.end(), b.calls.begin(), b.calls.end(), calls_equal);
}

// Fields of other kinds are ignored: they are not serialized, so comparing them would make a
// decoded model differ from the one it was written from.
bool nodes_equal(const Node& a, const Node& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case NodeKind::kKernel:
      return kernels_equal(a.kernel, b.kernel);
    case NodeKind::kMemset:
      return memsets_equal(a.memset, b.memset);
    case NodeKind::kMemcpy:
      return memcpys_equal(a.memcpy, b.memcpy);
    case NodeKind::kEventRecord:
    case NodeKind::kEventWait:
      return a.event == b.event;
    case NodeKind::kEmpty:
      return true;
    case NodeKind::kChildGraph:
      return a.child == b.child;
    case NodeKind::kCollective:
      return collectives_equal(a.collective, b.collective);
  }
  return false;  // unknown kinds are never equal: nothing says what they hold
}

bool edges_equal(const Edge& a, const Edge& b) {
  return a.from == b.from && a.to == b.to && a.from_port == b.from_port && a.to_port == b.to_port &&
         a.type == b.type;
}

Status delta_error(size_t entry, const std::string& why) {
  return Error(FOUNDRY_ERR_FORMAT, "graph delta entry " + std::to_string(entry) + ": " + why);
}

Status check_delta_entry(const GraphModel& tmpl, size_t i, const NodeDelta& nd) {
  if (nd.node >= tmpl.nodes.size())
    return delta_error(i, "node " + std::to_string(nd.node) + " outside the template's " +
                              std::to_string(tmpl.nodes.size()) + " nodes");
  NodeKind want = tmpl.nodes[nd.node].kind;
  if (nd.value.kind != want)
    return delta_error(i, "node " + std::to_string(nd.node) + " is a " + node_kind_name(nd.value.kind) +
                              " node but the template's is a " + node_kind_name(want) + " node");
  // Children are shared with the template, so an index past them would be dangling.
  if (want == NodeKind::kChildGraph && nd.value.child >= tmpl.children.size())
    return delta_error(i, "child graph index " + std::to_string(nd.value.child) + " outside the template's " +
                              std::to_string(tmpl.children.size()) + " child graphs");
  return Status::Ok();
}

}  // namespace

uint64_t topology_key(const GraphModel& g) { return key_of(topology_bytes(g)); }

bool same_topology(const GraphModel& a, const GraphModel& b) { return topology_bytes(a) == topology_bytes(b); }

bool models_equal(const GraphModel& a, const GraphModel& b) {
  if (a.nodes.size() != b.nodes.size() || a.edges.size() != b.edges.size() ||
      a.children.size() != b.children.size())
    return false;
  for (size_t i = 0; i < a.nodes.size(); ++i)
    if (!nodes_equal(a.nodes[i], b.nodes[i])) return false;
  for (size_t i = 0; i < a.edges.size(); ++i)
    if (!edges_equal(a.edges[i], b.edges[i])) return false;
  for (size_t i = 0; i < a.children.size(); ++i)
    if (!models_equal(a.children[i], b.children[i])) return false;
  return true;
}

std::vector<NodeDelta> make_delta(const GraphModel& tmpl, const GraphModel& member) {
  std::vector<NodeDelta> delta;
  // Same topology means same node count; min() only keeps a broken precondition memory-safe.
  size_t n = std::min(tmpl.nodes.size(), member.nodes.size());
  for (size_t i = 0; i < n; ++i)
    if (!nodes_equal(tmpl.nodes[i], member.nodes[i])) delta.push_back({static_cast<uint32_t>(i), member.nodes[i]});
  return delta;
}

Status apply_delta(const GraphModel& tmpl, const std::vector<NodeDelta>& d, GraphModel* out) {
  // Everything is checked before copying, so a refused delta leaves *out untouched.
  for (size_t i = 0; i < d.size(); ++i) FOUNDRY_RETURN_IF_ERROR(check_delta_entry(tmpl, i, d[i]));
  GraphModel member = tmpl;
  for (const NodeDelta& nd : d) member.nodes[nd.node] = nd.value;
  *out = std::move(member);
  return Status::Ok();
}

Grouping group_graphs(const std::vector<const GraphModel*>& graphs) {
  Grouping g;
  g.template_of.reserve(graphs.size());
  // Each graph's topology is encoded once; the templates' encodings are kept for the exact
  // comparison (what same_topology does), keyed by their hash (what topology_key computes).
  std::vector<std::vector<uint8_t>> template_topology;  // parallel to g.templates
  std::unordered_map<uint64_t, std::vector<size_t>> groups_by_key;  // key -> positions in g.templates
  for (size_t i = 0; i < graphs.size(); ++i) {
    std::vector<uint8_t> topo = topology_bytes(*graphs[i]);
    std::vector<size_t>& candidates = groups_by_key[key_of(topo)];
    bool placed = false;
    for (size_t t : candidates) {
      if (template_topology[t] == topo) {
        g.template_of.push_back(g.templates[t]);
        placed = true;
        break;
      }
    }
    if (placed) continue;
    // A new topology, or a hash collision with a different one: this graph starts a group.
    candidates.push_back(g.templates.size());
    g.templates.push_back(static_cast<uint32_t>(i));
    g.template_of.push_back(static_cast<uint32_t>(i));
    template_topology.push_back(std::move(topo));
  }
  return g;
}

}  // namespace foundry
