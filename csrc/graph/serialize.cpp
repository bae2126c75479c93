#include "graph/serialize.h"

#include <string>
#include <utility>

namespace foundry {
namespace {

// Smallest encodings, for ByteReader::count32: a hostile count is refused unless the remaining
// bytes could really hold that many elements.
constexpr size_t kMinNodeBytes = 4;        // kind alone (empty node)
constexpr size_t kMinEdgeBytes = 4 + 4 + 3;
constexpr size_t kMinGraphBytes = 4 * 3;   // three zero counts
constexpr size_t kSlotBytes = 4 + 4;
constexpr size_t kMinAttrBytes = 4 + 8;    // id + empty value's length

Status format_error(const std::string& message) { return Error(FOUNDRY_ERR_FORMAT, message); }

// Prefixes a nested error with the element it happened in, keeping its code.
Status within(const std::string& where, const Status& st) {
  if (st.ok()) return st;
  return Error(st.code(), where + ": " + st.message());
}

std::string at_depth(int depth) { return depth == 0 ? "" : " (child graph depth " + std::to_string(depth) + ")"; }

bool known_kind(uint32_t kind) { return kind <= static_cast<uint32_t>(NodeKind::kChildGraph); }

// i32 fields travel as their two's-complement u32 bit pattern.
void put_i32(ByteWriter& w, int32_t v) { w.u32(static_cast<uint32_t>(v)); }
bool get_i32(ByteReader& r, int32_t* out) {
  uint32_t bits;
  if (!r.u32(&bits)) return false;
  *out = static_cast<int32_t>(bits);
  return true;
}

void write_kernel(ByteWriter& w, const KernelNode& k) {
  w.u64(k.image_hash);
  w.string(k.name);
  for (uint32_t v : k.grid) w.u32(v);
  for (uint32_t v : k.block) w.u32(v);
  w.u32(k.shared_mem);
  w.blob(k.params.data(), k.params.size());
  w.u32(static_cast<uint32_t>(k.slots.size()));
  for (const ParamSlot& s : k.slots) {
    w.u32(s.offset);
    w.u32(s.size);
  }
  w.u32(static_cast<uint32_t>(k.attrs.size()));
  for (const LaunchAttr& a : k.attrs) {
    w.u32(a.id);
    w.blob(a.value.data(), a.value.size());
  }
  put_i32(w, k.func.max_dynamic_shared);
  put_i32(w, k.func.preferred_carveout);
  for (int32_t v : k.func.required_cluster) put_i32(w, v);
  put_i32(w, k.func.non_portable_cluster);
  put_i32(w, k.func.cluster_scheduling);
}

// The builder copies each slot out of the params buffer, so a slot reaching past it would be an
// out-of-bounds read there. Computed in 64 bits: offset + size cannot wrap.
Status check_slots(const KernelNode& k) {
  for (size_t i = 0; i < k.slots.size(); ++i) {
    uint64_t end = static_cast<uint64_t>(k.slots[i].offset) + k.slots[i].size;
    if (end > k.params.size())
      return format_error("param slot " + std::to_string(i) + " (offset " + std::to_string(k.slots[i].offset) +
                          ", size " + std::to_string(k.slots[i].size) + ") lies outside the " +
                          std::to_string(k.params.size()) + "-byte parameter buffer");
  }
  return Status::Ok();
}

Status read_slots(ByteReader& r, KernelNode* k) {
  uint32_t n = 0;
  if (!r.count32(&n, kSlotBytes)) return r.status("kernel param slots");
  k->slots.resize(n);  // bounded by count32
  for (ParamSlot& s : k->slots) {
    r.u32(&s.offset);
    r.u32(&s.size);
  }
  if (!r.ok()) return r.status("kernel param slots");
  return check_slots(*k);
}

Status read_attrs(ByteReader& r, KernelNode* k) {
  uint32_t n = 0;
  if (!r.count32(&n, kMinAttrBytes)) return r.status("kernel launch attributes");
  k->attrs.resize(n);  // bounded by count32
  for (LaunchAttr& a : k->attrs) {
    ByteSpan value;
    if (!r.u32(&a.id) || !r.blob(&value, kMaxLaunchAttrBytes)) return r.status("kernel launch attribute");
    a.value = value.to_vector();
  }
  return Status::Ok();
}

Status read_kernel(ByteReader& r, KernelNode* k) {
  r.u64(&k->image_hash);
  r.string(&k->name, kMaxKernelNameBytes);
  if (!r.ok()) return r.status("kernel name");
  for (uint32_t& v : k->grid) r.u32(&v);
  for (uint32_t& v : k->block) r.u32(&v);
  r.u32(&k->shared_mem);
  ByteSpan params;
  if (!r.blob(&params, kMaxKernelParamBytes)) return r.status("kernel parameters");
  k->params = params.to_vector();
  FOUNDRY_RETURN_IF_ERROR(read_slots(r, k));
  FOUNDRY_RETURN_IF_ERROR(read_attrs(r, k));
  get_i32(r, &k->func.max_dynamic_shared);
  get_i32(r, &k->func.preferred_carveout);
  for (int32_t& v : k->func.required_cluster) get_i32(r, &v);
  get_i32(r, &k->func.non_portable_cluster);
  get_i32(r, &k->func.cluster_scheduling);
  return r.status("kernel function attributes");
}

void write_memset(ByteWriter& w, const MemsetNode& m) {
  w.u64(m.dst);
  w.u64(m.pitch);
  w.u32(m.value);
  w.u32(m.element_size);
  w.u64(m.width);
  w.u64(m.height);
}

Status read_memset(ByteReader& r, MemsetNode* m) {
  r.u64(&m->dst);
  r.u64(&m->pitch);
  r.u32(&m->value);
  r.u32(&m->element_size);
  r.u64(&m->width);
  r.u64(&m->height);
  if (!r.ok()) return r.status("memset node");
  // The driver only knows these widths; anything else is corruption, not a future feature.
  if (m->element_size != 1 && m->element_size != 2 && m->element_size != 4)
    return format_error("memset node: element size " + std::to_string(m->element_size) + " is not 1, 2 or 4");
  return Status::Ok();
}

// The memcpy fields in one fixed order, shared by writer and reader so they cannot drift apart.
template <typename M, typename F>
void for_each_memcpy_field(M& m, F&& f) {
  for (auto* p : {&m.src, &m.dst, &m.src_x, &m.src_y, &m.src_z, &m.src_pitch, &m.src_height, &m.dst_x, &m.dst_y,
                  &m.dst_z, &m.dst_pitch, &m.dst_height, &m.width, &m.height, &m.depth})
    f(*p);
}

void write_memcpy(ByteWriter& w, const MemcpyNode& m) {
  for_each_memcpy_field(m, [&](const uint64_t& v) { w.u64(v); });
}

Status read_memcpy(ByteReader& r, MemcpyNode* m) {
  for_each_memcpy_field(*m, [&](uint64_t& v) { r.u64(&v); });
  return r.status("memcpy node");
}

void write_edge(ByteWriter& w, const Edge& e) {
  w.u32(e.from);
  w.u32(e.to);
  w.u8(e.from_port);
  w.u8(e.to_port);
  w.u8(e.type);
}

Status read_nodes(ByteReader& r, GraphModel* g, int depth) {
  uint32_t n = 0;
  if (!r.count32(&n, kMinNodeBytes)) return r.status(("graph node count" + at_depth(depth)).c_str());
  // Not reserved: a Node is far larger than its smallest encoding, so the vector grows only as
  // nodes are actually decoded.
  for (uint32_t i = 0; i < n; ++i) {
    Node node;
    FOUNDRY_RETURN_IF_ERROR(within("graph node " + std::to_string(i) + at_depth(depth), read_node(r, &node, depth)));
    g->nodes.push_back(std::move(node));
  }
  return Status::Ok();
}

Status read_edges(ByteReader& r, GraphModel* g, int depth) {
  uint32_t n = 0;
  if (!r.count32(&n, kMinEdgeBytes)) return r.status(("graph edge count" + at_depth(depth)).c_str());
  g->edges.resize(n);  // bounded by count32
  for (uint32_t i = 0; i < n; ++i) {
    Edge& e = g->edges[i];
    r.u32(&e.from);
    r.u32(&e.to);
    r.u8(&e.from_port);
    r.u8(&e.to_port);
    r.u8(&e.type);
    if (!r.ok()) return r.status(("graph edge " + std::to_string(i) + at_depth(depth)).c_str());
    if (e.from >= g->nodes.size() || e.to >= g->nodes.size())
      return format_error("graph edge " + std::to_string(i) + at_depth(depth) + ": endpoint " +
                          std::to_string(e.from) + " -> " + std::to_string(e.to) + " outside the " +
                          std::to_string(g->nodes.size()) + " nodes");
  }
  return Status::Ok();
}

Status read_children(ByteReader& r, GraphModel* g, int depth) {
  uint32_t n = 0;
  if (!r.count32(&n, kMinGraphBytes)) return r.status(("child graph count" + at_depth(depth)).c_str());
  g->children.resize(n);  // bounded by count32
  for (uint32_t i = 0; i < n; ++i)
    FOUNDRY_RETURN_IF_ERROR(within("child graph " + std::to_string(i) + at_depth(depth),
                                   read_graph(r, &g->children[i], depth + 1)));
  return Status::Ok();
}

// Child indices can only be checked once the children are known (they follow the nodes).
Status check_child_indices(const GraphModel& g, int depth) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.kind == NodeKind::kChildGraph && n.child >= g.children.size())
      return format_error("graph node " + std::to_string(i) + at_depth(depth) + ": child graph index " +
                          std::to_string(n.child) + " outside the " + std::to_string(g.children.size()) +
                          " child graphs");
  }
  return Status::Ok();
}

}  // namespace

void write_node(ByteWriter& w, const Node& n) {
  w.u32(static_cast<uint32_t>(n.kind));
  switch (n.kind) {
    case NodeKind::kKernel:
      write_kernel(w, n.kernel);
      break;
    case NodeKind::kMemset:
      write_memset(w, n.memset);
      break;
    case NodeKind::kMemcpy:
      write_memcpy(w, n.memcpy);
      break;
    case NodeKind::kEventRecord:
    case NodeKind::kEventWait:
      w.u32(n.event);
      break;
    case NodeKind::kEmpty:
      break;
    case NodeKind::kChildGraph:
      w.u32(n.child);
      break;
  }
}

Status read_node(ByteReader& r, Node* n, int depth) {
  if (depth < 0 || depth > kMaxGraphDepth)
    return format_error("node in a graph nested " + std::to_string(depth) + " levels deep (limit " +
                        std::to_string(kMaxGraphDepth) + ")");
  uint32_t kind = 0;
  if (!r.u32(&kind)) return r.status("node kind");
  if (!known_kind(kind)) return format_error("unknown node kind " + std::to_string(kind));
  Node node;
  node.kind = static_cast<NodeKind>(kind);
  switch (node.kind) {
    case NodeKind::kKernel:
      FOUNDRY_RETURN_IF_ERROR(read_kernel(r, &node.kernel));
      break;
    case NodeKind::kMemset:
      FOUNDRY_RETURN_IF_ERROR(read_memset(r, &node.memset));
      break;
    case NodeKind::kMemcpy:
      FOUNDRY_RETURN_IF_ERROR(read_memcpy(r, &node.memcpy));
      break;
    case NodeKind::kEventRecord:
    case NodeKind::kEventWait:
      // The event index is checked against the archive's event table by its reader, not here.
      if (!r.u32(&node.event)) return r.status("event node");
      break;
    case NodeKind::kEmpty:
      break;
    case NodeKind::kChildGraph:
      if (!r.u32(&node.child)) return r.status("child graph node");
      break;
  }
  *n = std::move(node);
  return Status::Ok();
}

void write_graph(ByteWriter& w, const GraphModel& g) {
  w.u32(static_cast<uint32_t>(g.nodes.size()));
  for (const Node& n : g.nodes) write_node(w, n);
  w.u32(static_cast<uint32_t>(g.edges.size()));
  for (const Edge& e : g.edges) write_edge(w, e);
  w.u32(static_cast<uint32_t>(g.children.size()));
  for (const GraphModel& c : g.children) write_graph(w, c);
}

Status read_graph(ByteReader& r, GraphModel* g, int depth) {
  // Checked before reading anything, so hostile nesting cannot recurse without bound.
  if (depth < 0 || depth > kMaxGraphDepth)
    return format_error("child graphs nested " + std::to_string(depth) + " levels deep (limit " +
                        std::to_string(kMaxGraphDepth) + ")");
  GraphModel model;
  FOUNDRY_RETURN_IF_ERROR(read_nodes(r, &model, depth));
  FOUNDRY_RETURN_IF_ERROR(read_edges(r, &model, depth));
  FOUNDRY_RETURN_IF_ERROR(read_children(r, &model, depth));
  FOUNDRY_RETURN_IF_ERROR(check_child_indices(model, depth));
  *g = std::move(model);
  return Status::Ok();
}

}  // namespace foundry
