#include "graph/serialize.h"

#include <algorithm>
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

// The same with the place named by a callable, so that a read that succeeds (every node of every
// graph) formats nothing.
template <typename Where, typename = decltype(std::declval<Where>()())>
Status within(Where&& where, const Status& st) {
  if (st.ok()) return st;
  return Error(st.code(), where() + ": " + st.message());
}

std::string at_depth(int depth) { return depth == 0 ? "" : " (child graph depth " + std::to_string(depth) + ")"; }

bool known_kind(uint32_t kind) { return kind <= static_cast<uint32_t>(NodeKind::kCollective); }

// i32 fields travel as their two's-complement u32 bit pattern.
void put_i32(ByteWriter& w, int32_t v) { w.u32(static_cast<uint32_t>(v)); }
bool get_i32(ByteReader& r, int32_t* out) {
  uint32_t bits;
  if (!r.u32(&bits)) return false;
  *out = static_cast<int32_t>(bits);
  return true;
}

// Bytes stored as the runs where they differ from `base` (bytes past base's end count as zero):
// u32 size, u32 run count, runs of (u32 offset, u32 length, bytes). Gaps shorter than a run
// header are folded into the runs.
void write_runs(ByteWriter& w, const std::vector<uint8_t>& data, const std::vector<uint8_t>* base) {
  auto base_at = [base](size_t i) -> uint8_t { return base && i < base->size() ? (*base)[i] : 0; };
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  size_t i = 0;
  while (i < data.size()) {
    if (data[i] == base_at(i)) {
      ++i;
      continue;
    }
    size_t start = i, last = i;
    for (; i < data.size(); ++i) {
      if (data[i] != base_at(i)) last = i;
      else if (i - last > 8) break;
    }
    runs.emplace_back(static_cast<uint32_t>(start), static_cast<uint32_t>(last + 1 - start));
    i = last + 1;
  }
  w.u32(static_cast<uint32_t>(data.size()));
  w.u32(static_cast<uint32_t>(runs.size()));
  for (const auto& [off, len] : runs) {
    w.u32(off);
    w.u32(len);
    w.raw(data.data() + off, len);
  }
}

Status read_runs(ByteReader& r, const std::vector<uint8_t>* base, size_t max_size, std::vector<uint8_t>* out,
                 const char* what) {
  uint32_t size = 0, n = 0;
  if (!r.u32(&size)) return r.status(what);
  if (size > max_size) return format_error(std::string(what) + ": " + std::to_string(size) + " bytes, more than " + std::to_string(max_size));
  if (!r.count32(&n, 8)) return r.status(what);
  out->assign(size, 0);
  if (base) std::copy(base->begin(), base->begin() + std::min<size_t>(base->size(), size), out->begin());
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t off = 0, len = 0;
    if (!r.u32(&off) || !r.u32(&len)) return r.status(what);
    if (static_cast<uint64_t>(off) + len > size) return format_error(std::string(what) + ": a run reaches past the end");
    if (!r.raw(out->data() + off, len)) return r.status(what);
  }
  return Status::Ok();
}

void write_slots(ByteWriter& w, const KernelNode& k) {
  w.u32(static_cast<uint32_t>(k.slots.size()));
  for (const ParamSlot& s : k.slots) {
    w.u32(s.offset);
    w.u32(s.size);
  }
}

bool same_slots(const std::vector<ParamSlot>& a, const std::vector<ParamSlot>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const ParamSlot& x, const ParamSlot& y) { return x.offset == y.offset && x.size == y.size; });
}

void write_kernel(ByteWriter& w, const KernelNode& k, NameTable* names) {
  w.u64(k.image_hash);
  if (names) w.u32(names->intern(k.name));
  else w.string(k.name);
  for (uint32_t v : k.grid) w.u32(v);
  for (uint32_t v : k.block) w.u32(v);
  w.u32(k.shared_mem);
  write_runs(w, k.params, nullptr);
  write_slots(w, k);
  w.u32(static_cast<uint32_t>(k.attrs.size()));
  for (const LaunchAttr& a : k.attrs) {
    w.u32(a.id);
    write_runs(w, a.value, nullptr);
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
    if (!r.u32(&a.id)) return r.status("kernel launch attribute");
    FOUNDRY_RETURN_IF_ERROR(read_runs(r, nullptr, kMaxLaunchAttrBytes, &a.value, "kernel launch attribute"));
  }
  return Status::Ok();
}

Status read_kernel(ByteReader& r, KernelNode* k, const std::vector<std::string>* names) {
  r.u64(&k->image_hash);
  if (names) {
    uint32_t index = 0;
    if (!r.u32(&index)) return r.status("kernel name");
    if (index >= names->size()) return format_error("kernel name index " + std::to_string(index) + " outside the " + std::to_string(names->size()) + " names");
    k->name = (*names)[index];
  } else {
    r.string(&k->name, kMaxKernelNameBytes);
  }
  if (!r.ok()) return r.status("kernel name");
  for (uint32_t& v : k->grid) r.u32(&v);
  for (uint32_t& v : k->block) r.u32(&v);
  r.u32(&k->shared_mem);
  if (!r.ok()) return r.status("kernel launch dimensions");
  FOUNDRY_RETURN_IF_ERROR(read_runs(r, nullptr, kMaxKernelParamBytes, &k->params, "kernel parameters"));
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

constexpr size_t kCallBytes = 4 * 2 + 8 * 3 + 4 * 5;

// The launch's calls (the node's kernel index and NCCL's kernel name are written by the caller).
void write_calls(ByteWriter& w, const std::vector<CollectiveCall>& calls) {
  w.u32(static_cast<uint32_t>(calls.size()));
  for (const CollectiveCall& c : calls) {
    w.u32(c.op);
    w.u32(c.comm);
    w.u64(c.send);
    w.u64(c.recv);
    w.u64(c.count);
    put_i32(w, c.dtype);
    put_i32(w, c.redop);
    put_i32(w, c.root);
    put_i32(w, c.nranks);
    put_i32(w, c.rank);
  }
}

Status read_calls(ByteReader& r, std::vector<CollectiveCall>* calls) {
  uint32_t n = 0;
  if (!r.count32(&n, kCallBytes)) return r.status("collective calls");
  if (n == 0) return format_error("collective node without calls");
  calls->resize(n);  // bounded by count32
  for (CollectiveCall& c : *calls) {
    r.u32(&c.op);
    r.u32(&c.comm);
    r.u64(&c.send);
    r.u64(&c.recv);
    r.u64(&c.count);
    get_i32(r, &c.dtype);
    get_i32(r, &c.redop);
    get_i32(r, &c.root);
    get_i32(r, &c.nranks);
    get_i32(r, &c.rank);
    if (!r.ok()) return r.status("collective call");
    if (c.op > kMaxCollectiveOp) return format_error("collective call: unknown operation " + std::to_string(c.op));
  }
  return Status::Ok();
}

void write_collective(ByteWriter& w, const CollectiveNode& c) {
  w.string(c.name);
  w.u32(c.kernel);
  write_calls(w, c.calls);
}

Status read_collective(ByteReader& r, CollectiveNode* c) {
  if (!r.string(&c->name, kMaxKernelNameBytes) || !r.u32(&c->kernel)) return r.status("collective node");
  return read_calls(r, &c->calls);
}

void write_edge(ByteWriter& w, const Edge& e) {
  w.u32(e.from);
  w.u32(e.to);
  w.u8(e.from_port);
  w.u8(e.to_port);
  w.u8(e.type);
}

Status read_nodes(ByteReader& r, GraphModel* g, int depth, const std::vector<std::string>* names) {
  uint32_t n = 0;
  if (!r.count32(&n, kMinNodeBytes)) return r.status(("graph node count" + at_depth(depth)).c_str());
  // Reserved up to a cap: a Node is far larger than its smallest encoding, so a hostile count may
  // not size the vector, but a real graph (a few thousand nodes) is decoded without reallocating.
  constexpr uint32_t kReserveCap = 1u << 14;
  g->nodes.reserve(std::min(n, kReserveCap));
  for (uint32_t i = 0; i < n; ++i) {
    Node node;
    FOUNDRY_RETURN_IF_ERROR(within([&] { return "graph node " + std::to_string(i) + at_depth(depth); },
                                   read_node(r, &node, depth, names)));
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

Status read_children(ByteReader& r, GraphModel* g, int depth, const std::vector<std::string>* names) {
  uint32_t n = 0;
  if (!r.count32(&n, kMinGraphBytes)) return r.status(("child graph count" + at_depth(depth)).c_str());
  g->children.resize(n);  // bounded by count32
  for (uint32_t i = 0; i < n; ++i)
    FOUNDRY_RETURN_IF_ERROR(within("child graph " + std::to_string(i) + at_depth(depth),
                                   read_graph(r, &g->children[i], depth + 1, names)));
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

void write_node(ByteWriter& w, const Node& n, NameTable* names) {
  w.u32(static_cast<uint32_t>(n.kind));
  switch (n.kind) {
    case NodeKind::kKernel:
      write_kernel(w, n.kernel, names);
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
    case NodeKind::kCollective:
      write_collective(w, n.collective);
      break;
  }
}

Status read_node(ByteReader& r, Node* n, int depth, const std::vector<std::string>* names) {
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
      FOUNDRY_RETURN_IF_ERROR(read_kernel(r, &node.kernel, names));
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
    case NodeKind::kCollective:
      FOUNDRY_RETURN_IF_ERROR(read_collective(r, &node.collective));
      break;
  }
  *n = std::move(node);
  return Status::Ok();
}

void write_graph(ByteWriter& w, const GraphModel& g, NameTable* names) {
  w.u32(static_cast<uint32_t>(g.nodes.size()));
  for (const Node& n : g.nodes) write_node(w, n, names);
  w.u32(static_cast<uint32_t>(g.edges.size()));
  for (const Edge& e : g.edges) write_edge(w, e);
  w.u32(static_cast<uint32_t>(g.children.size()));
  for (const GraphModel& c : g.children) write_graph(w, c, names);
}

Status read_graph(ByteReader& r, GraphModel* g, int depth, const std::vector<std::string>* names) {
  // Checked before reading anything, so hostile nesting cannot recurse without bound.
  if (depth < 0 || depth > kMaxGraphDepth)
    return format_error("child graphs nested " + std::to_string(depth) + " levels deep (limit " +
                        std::to_string(kMaxGraphDepth) + ")");
  GraphModel model;
  FOUNDRY_RETURN_IF_ERROR(read_nodes(r, &model, depth, names));
  FOUNDRY_RETURN_IF_ERROR(read_edges(r, &model, depth));
  FOUNDRY_RETURN_IF_ERROR(read_children(r, &model, depth, names));
  FOUNDRY_RETURN_IF_ERROR(check_child_indices(model, depth));
  *g = std::move(model);
  return Status::Ok();
}

uint32_t NameTable::intern(const std::string& name) {
  auto it = index_.find(name);
  if (it != index_.end()) return it->second;
  uint32_t i = static_cast<uint32_t>(names_.size());
  names_.push_back(name);
  index_.emplace(name, i);
  return i;
}

void write_names(ByteWriter& w, const NameTable& t) {
  w.u32(static_cast<uint32_t>(t.names().size()));
  for (const std::string& n : t.names()) w.string(n);
}

Status read_names(ByteReader& r, std::vector<std::string>* names) {
  uint32_t n = 0;
  if (!r.count32(&n, 8)) return r.status("kernel name table");
  names->resize(n);  // bounded by count32
  for (std::string& s : *names) {
    if (!r.string(&s, kMaxKernelNameBytes)) return r.status("kernel name table");
  }
  return Status::Ok();
}

void write_delta(ByteWriter& w, const GraphModel& tmpl, const std::vector<NodeDelta>& d) {
  w.u32(static_cast<uint32_t>(d.size()));
  for (const NodeDelta& nd : d) {
    w.u32(nd.node);
    const Node& n = nd.value;
    switch (n.kind) {
      case NodeKind::kKernel: {
        const KernelNode& k = n.kernel;
        // Which kernel runs, and its parameter layout, may differ from the template's node.
        const KernelNode* t = nd.node < tmpl.nodes.size() ? &tmpl.nodes[nd.node].kernel : nullptr;
        bool other = t == nullptr || t->image_hash != k.image_hash || t->name != k.name || !same_slots(t->slots, k.slots);
        w.u8(other ? 1 : 0);
        if (other) {
          w.u64(k.image_hash);
          w.string(k.name);
          write_slots(w, k);
        }
        for (uint32_t v : k.grid) w.u32(v);
        for (uint32_t v : k.block) w.u32(v);
        w.u32(k.shared_mem);
        put_i32(w, k.func.max_dynamic_shared);
        put_i32(w, k.func.preferred_carveout);
        const std::vector<uint8_t>* base = nd.node < tmpl.nodes.size() ? &tmpl.nodes[nd.node].kernel.params : nullptr;
        write_runs(w, k.params, base);
        break;
      }
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
      case NodeKind::kCollective:
        write_collective(w, n.collective);
        break;
      case NodeKind::kEmpty:
      case NodeKind::kChildGraph:
        break;  // never in a delta: nothing updatable (child graphs are part of the topology)
    }
  }
}

Status read_delta(ByteReader& r, const GraphModel& tmpl, std::vector<NodeDelta>* d) {
  uint32_t n = 0;
  if (!r.count32(&n, 8)) return r.status("graph delta entry count");
  std::vector<NodeDelta> entries;
  for (uint32_t i = 0; i < n; ++i) {
    auto where = [i] { return "graph delta entry " + std::to_string(i); };
    uint32_t node = 0;
    if (!r.u32(&node)) return r.status(where().c_str());
    if (node >= tmpl.nodes.size()) {
      return format_error(where() + ": node " + std::to_string(node) + " outside the template's " +
                          std::to_string(tmpl.nodes.size()) + " nodes");
    }
    NodeDelta nd{node, tmpl.nodes[node]};
    Node& v = nd.value;
    switch (v.kind) {
      case NodeKind::kKernel: {
        KernelNode& k = v.kernel;
        uint8_t other = 0;
        if (!r.u8(&other)) return r.status(where().c_str());
        if (other > 1) return format_error(where() + ": kernel identity flag " + std::to_string(other) + " is not 0 or 1");
        if (other) {
          r.u64(&k.image_hash);
          r.string(&k.name, kMaxKernelNameBytes);
          if (!r.ok()) return r.status(where().c_str());
          uint32_t n_slots = 0;
          if (!r.count32(&n_slots, kSlotBytes)) return r.status(where().c_str());
          k.slots.resize(n_slots);  // bounded by count32; checked against the params below
          for (ParamSlot& sl : k.slots) {
            r.u32(&sl.offset);
            r.u32(&sl.size);
          }
        }
        for (uint32_t& x : k.grid) r.u32(&x);
        for (uint32_t& x : k.block) r.u32(&x);
        r.u32(&k.shared_mem);
        get_i32(r, &k.func.max_dynamic_shared);
        get_i32(r, &k.func.preferred_carveout);
        if (!r.ok()) return r.status(where().c_str());
        std::vector<uint8_t> params;
        FOUNDRY_RETURN_IF_ERROR(within(where, read_runs(r, &tmpl.nodes[node].kernel.params, kMaxKernelParamBytes, &params,
                                                        "kernel parameters")));
        k.params = std::move(params);
        FOUNDRY_RETURN_IF_ERROR(within(where, check_slots(k)));
        break;
      }
      case NodeKind::kMemset:
        FOUNDRY_RETURN_IF_ERROR(within(where, read_memset(r, &v.memset)));
        break;
      case NodeKind::kMemcpy:
        FOUNDRY_RETURN_IF_ERROR(within(where, read_memcpy(r, &v.memcpy)));
        break;
      case NodeKind::kEventRecord:
      case NodeKind::kEventWait:
        if (!r.u32(&v.event)) return r.status(where().c_str());
        break;
      case NodeKind::kCollective: {
        CollectiveNode c;
        FOUNDRY_RETURN_IF_ERROR(within(where, read_collective(r, &c)));
        if (c.kernel != v.collective.kernel)
          return format_error(where() + ": collective node changes its kernel slot, which is part of the topology");
        v.collective = std::move(c);
        break;
      }
      case NodeKind::kEmpty:
      case NodeKind::kChildGraph:
        return format_error(where() + ": node " + std::to_string(node) + " is a " + node_kind_name(v.kind) +
                            " node, which has nothing to update");
    }
    entries.push_back(std::move(nd));
  }
  *d = std::move(entries);
  return Status::Ok();
}

}  // namespace foundry
