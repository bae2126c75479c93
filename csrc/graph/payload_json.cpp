#include "graph/payload_json.h"

#include <cinttypes>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>

#include "archive/bytes.h"
#include "common/json.h"
#include "graph/serialize.h"
#include "graph/topology.h"

namespace foundry {
namespace {

using json::Value;

// The document's own version (its layout is in payload_json.h), apart from the binary payload's:
// 2 since kernel deltas may name another kernel; 3 since a kernel's "func" holds its cache
// preference ("cache_config"). Version 2 documents are still read (no cache_config: PREFER_NONE).
constexpr uint32_t kPayloadJsonVersion = 3;
constexpr uint32_t kOldestPayloadJsonVersion = 2;

// Limits read_payload applies to what it reads (graph names, graph count); mirrored here so a
// document accepted here makes a file read_payload accepts.
constexpr size_t kMaxGraphName = 4096;
constexpr size_t kMaxMembers = 1 << 20;

// ---- writing --------------------------------------------------------------------------------

std::string hex_bytes(const std::vector<uint8_t>& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

std::string hex_hash(uint64_t h) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

template <typename T, size_t N>
Value triple(const T (&v)[N]) {
  Value a = Value::array();
  for (const T& x : v) a.push(std::is_signed<T>::value ? Value::i64(x) : Value::u64(static_cast<uint64_t>(x)));
  return a;
}

Value kernel_value(const KernelNode& k) {
  Value slots = Value::array();
  for (const ParamSlot& s : k.slots) slots.push(Value::object().set("offset", Value::u64(s.offset)).set("size", Value::u64(s.size)));
  Value attrs = Value::array();
  for (const LaunchAttr& a : k.attrs) attrs.push(Value::object().set("id", Value::u64(a.id)).set("value", Value::string(hex_bytes(a.value))));
  Value func = Value::object();
  func.set("max_dynamic_shared", Value::i64(k.func.max_dynamic_shared))
      .set("preferred_carveout", Value::i64(k.func.preferred_carveout))
      .set("required_cluster", triple(k.func.required_cluster))
      .set("non_portable_cluster", Value::i64(k.func.non_portable_cluster))
      .set("cluster_scheduling", Value::i64(k.func.cluster_scheduling))
      .set("cache_config", Value::i64(k.func.cache_config));
  Value v = Value::object();
  v.set("image", Value::string(hex_hash(k.image_hash)))
      .set("name", Value::string(k.name))
      .set("grid", triple(k.grid))
      .set("block", triple(k.block))
      .set("shared_mem", Value::u64(k.shared_mem))
      .set("params", Value::string(hex_bytes(k.params)))
      .set("slots", std::move(slots))
      .set("attrs", std::move(attrs))
      .set("func", std::move(func));
  return v;
}

Value memset_value(const MemsetNode& m) {
  Value v = Value::object();
  v.set("dst", Value::u64(m.dst))
      .set("pitch", Value::u64(m.pitch))
      .set("value", Value::u64(m.value))
      .set("element_size", Value::u64(m.element_size))
      .set("width", Value::u64(m.width))
      .set("height", Value::u64(m.height));
  return v;
}

// The memcpy fields by name, in one order shared by writer and reader.
template <typename M, typename F>
void for_each_memcpy_field(M& m, F&& f) {
  f("src", m.src), f("dst", m.dst);
  f("src_x", m.src_x), f("src_y", m.src_y), f("src_z", m.src_z), f("src_pitch", m.src_pitch);
  f("src_height", m.src_height);
  f("dst_x", m.dst_x), f("dst_y", m.dst_y), f("dst_z", m.dst_z), f("dst_pitch", m.dst_pitch);
  f("dst_height", m.dst_height);
  f("width", m.width), f("height", m.height), f("depth", m.depth);
}

Value memcpy_value(const MemcpyNode& m) {
  Value v = Value::object();
  for_each_memcpy_field(m, [&](const char* key, const uint64_t& x) { v.set(key, Value::u64(x)); });
  return v;
}

// A collective call's fields by name, in one order shared by writer and reader.
template <typename C, typename U, typename I>
void for_each_call_field(C& c, U&& u, I&& i) {
  u("op", c.op), u("comm", c.comm), u("send", c.send), u("recv", c.recv), u("count", c.count);
  i("dtype", c.dtype), i("redop", c.redop), i("root", c.root), i("nranks", c.nranks), i("rank", c.rank);
}

Value collective_value(const CollectiveNode& c) {
  Value calls = Value::array();
  for (const CollectiveCall& call : c.calls) {
    Value v = Value::object();
    for_each_call_field(call, [&](const char* key, const auto& x) { v.set(key, Value::u64(x)); },
                        [&](const char* key, const int32_t& x) { v.set(key, Value::i64(x)); });
    calls.push(std::move(v));
  }
  Value v = Value::object();
  v.set("name", Value::string(c.name)).set("kernel", Value::u64(c.kernel)).set("calls", std::move(calls));
  return v;
}

Value node_value(const Node& n) {
  Value v = Value::object();
  v.set("kind", Value::string(node_kind_name(n.kind)));
  switch (n.kind) {
    case NodeKind::kKernel: v.set("kernel", kernel_value(n.kernel)); break;
    case NodeKind::kMemset: v.set("memset", memset_value(n.memset)); break;
    case NodeKind::kMemcpy: v.set("memcpy", memcpy_value(n.memcpy)); break;
    case NodeKind::kEventRecord:
    case NodeKind::kEventWait: v.set("event", Value::u64(n.event)); break;
    case NodeKind::kEmpty: break;
    case NodeKind::kChildGraph: v.set("child", Value::u64(n.child)); break;
    case NodeKind::kCollective: v.set("collective", collective_value(n.collective)); break;
  }
  return v;
}

Value graph_value(const GraphModel& g) {
  Value nodes = Value::array();
  for (const Node& n : g.nodes) nodes.push(node_value(n));
  Value edges = Value::array();
  for (const Edge& e : g.edges) {
    edges.push(Value::object()
                   .set("from", Value::u64(e.from))
                   .set("to", Value::u64(e.to))
                   .set("from_port", Value::u64(e.from_port))
                   .set("to_port", Value::u64(e.to_port))
                   .set("type", Value::u64(e.type)));
  }
  Value children = Value::array();
  for (const GraphModel& c : g.children) children.push(graph_value(c));
  Value v = Value::object();
  v.set("nodes", std::move(nodes)).set("edges", std::move(edges)).set("children", std::move(children));
  return v;
}

Value member_value(const PayloadMember& m) {
  Value delta = Value::array();
  for (const NodeDelta& d : m.delta) delta.push(Value::object().set("node", Value::u64(d.node)).set("value", node_value(d.value)));
  Value refs = Value::array();
  for (const RegionRef& r : m.refs) {
    refs.push(Value::object().set("offset", Value::u64(r.offset)).set("size", Value::u64(r.size)).set("kind", Value::u64(r.kind)));
  }
  Value v = Value::object();
  v.set("name", Value::string(m.name))
      .set("template", Value::u64(m.template_index))
      .set("delta", std::move(delta))
      .set("refs", std::move(refs));
  return v;
}

// ---- reading --------------------------------------------------------------------------------

// The first error of one document, and its version. Readers chain many reads and check once, as
// ByteReader does.
class Ctx {
 public:
  uint32_t version = kPayloadJsonVersion;

  bool ok() const { return error_.ok(); }
  const Status& status() const { return error_; }
  bool fail(const std::string& path, const std::string& why) {
    if (error_.ok()) error_ = Error(FOUNDRY_ERR_FORMAT, "payload JSON: " + (path.empty() ? "document" : path) + ": " + why);
    return false;
  }

 private:
  Status error_;
};

std::string index_path(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

bool read_uint(Ctx& c, const Value* v, const std::string& path, uint64_t max, uint64_t* out) {
  if (!c.ok()) return false;
  if (v == nullptr) return c.fail(path, "missing");
  uint64_t x = 0;
  if (!v->get_u64(&x)) return c.fail(path, std::string("expected an unsigned integer, found ") + v->type_name());
  if (x > max) return c.fail(path, "value " + std::to_string(x) + " out of range (at most " + std::to_string(max) + ")");
  *out = x;
  return true;
}

template <typename T>
bool read_unsigned(Ctx& c, const Value* v, const std::string& path, T* out) {
  uint64_t x = 0;
  if (!read_uint(c, v, path, std::numeric_limits<T>::max(), &x)) return false;
  *out = static_cast<T>(x);
  return true;
}

bool read_i32(Ctx& c, const Value* v, const std::string& path, int32_t* out) {
  if (!c.ok()) return false;
  if (v == nullptr) return c.fail(path, "missing");
  int64_t x = 0;
  if (!v->get_i64(&x)) return c.fail(path, std::string("expected an integer, found ") + v->type_name());
  if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
    return c.fail(path, "value " + std::to_string(x) + " out of the 32-bit signed range");
  *out = static_cast<int32_t>(x);
  return true;
}

int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

bool read_string(Ctx& c, const Value* v, const std::string& path, size_t max, std::string* out) {
  if (!c.ok()) return false;
  if (v == nullptr) return c.fail(path, "missing");
  if (!v->is_string()) return c.fail(path, std::string("expected a string, found ") + v->type_name());
  if (v->str().size() > max) return c.fail(path, "longer than " + std::to_string(max) + " bytes");
  *out = v->str();
  return true;
}

bool read_hex(Ctx& c, const Value* v, const std::string& path, size_t max_bytes, std::vector<uint8_t>* out) {
  std::string s;
  if (!read_string(c, v, path, max_bytes * 2, &s)) return false;
  if (s.size() % 2 != 0) return c.fail(path, "hex string of odd length");
  std::vector<uint8_t> bytes(s.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return c.fail(path, "not a hex string (character " + std::to_string(hi < 0 ? 2 * i : 2 * i + 1) + ")");
    bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  *out = std::move(bytes);
  return true;
}

bool read_hash(Ctx& c, const Value* v, const std::string& path, uint64_t* out) {
  std::string s;
  if (!read_string(c, v, path, 64, &s)) return false;
  if (s.size() != 16) return c.fail(path, "expected 16 hex digits, found \"" + s + "\"");
  uint64_t h = 0;
  for (char ch : s) {
    int d = hex_digit(ch);
    if (d < 0) return c.fail(path, "expected 16 hex digits, found \"" + s + "\"");
    h = h << 4 | static_cast<uint64_t>(d);
  }
  *out = h;
  return true;
}

// The fields of one JSON object. Every getter records the key it read, so that finish() can refuse
// keys nobody read: a misspelt field must not silently fall back to a default.
class Obj {
 public:
  Obj(Ctx& c, const Value* v, std::string path) : c_(c), v_(v), path_(std::move(path)) {
    if (!c_.ok()) return;
    if (v_ == nullptr) c_.fail(path_, "missing");
    else if (!v_->is_object()) c_.fail(path_, std::string("expected an object, found ") + v_->type_name());
  }

  std::string at(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  const Value* get(const char* key) {
    read_.emplace_back(key);
    return c_.ok() ? v_->find(key) : nullptr;
  }

  template <typename T>
  bool u(const char* key, T* out) { return read_unsigned(c_, get(key), at(key), out); }
  bool i32(const char* key, int32_t* out) { return read_i32(c_, get(key), at(key), out); }
  bool str(const char* key, size_t max, std::string* out) { return read_string(c_, get(key), at(key), max, out); }
  bool hex(const char* key, size_t max, std::vector<uint8_t>* out) { return read_hex(c_, get(key), at(key), max, out); }
  bool hash(const char* key, uint64_t* out) { return read_hash(c_, get(key), at(key), out); }

  // The array named key (null after recording the error when it is missing or not an array).
  const std::vector<Value>* array(const char* key) {
    const Value* v = get(key);
    if (!c_.ok()) return nullptr;
    if (v == nullptr) return c_.fail(at(key), "missing"), nullptr;
    if (!v->is_array()) return c_.fail(at(key), std::string("expected an array, found ") + v->type_name()), nullptr;
    return &v->items();
  }

  // An array of exactly three integers (grid, block, cluster shape).
  template <typename T>
  bool three(const char* key, T (&out)[3]) {
    const std::vector<Value>* a = array(key);
    if (a == nullptr) return false;
    if (a->size() != 3) return c_.fail(at(key), "expected 3 elements, found " + std::to_string(a->size()));
    for (size_t i = 0; i < 3; ++i) {
      if constexpr (std::is_signed<T>::value) read_i32(c_, &(*a)[i], index_path(at(key), i), &out[i]);
      else read_unsigned(c_, &(*a)[i], index_path(at(key), i), &out[i]);
    }
    return c_.ok();
  }

  bool finish() {
    if (!c_.ok()) return false;
    for (const json::Member& m : v_->members()) {
      bool known = false;
      for (const std::string& k : read_) known = known || k == m.key;
      if (!known) return c_.fail(path_, "unknown field \"" + m.key + "\"");
    }
    return true;
  }

 private:
  Ctx& c_;
  const Value* v_;
  std::string path_;
  std::vector<std::string> read_;
};

bool read_func(Ctx& c, const Value* v, const std::string& path, FunctionAttrs* f) {
  Obj o(c, v, path);
  o.i32("max_dynamic_shared", &f->max_dynamic_shared);
  o.i32("preferred_carveout", &f->preferred_carveout);
  o.three("required_cluster", f->required_cluster);
  o.i32("non_portable_cluster", &f->non_portable_cluster);
  o.i32("cluster_scheduling", &f->cluster_scheduling);
  // Version 2 documents have no cache_config (finish() refuses one there as an unknown field).
  if (c.version >= 3 && o.i32("cache_config", &f->cache_config) &&
      (f->cache_config < kCachePreferNone || f->cache_config > kCachePreferEqual))
    c.fail(o.at("cache_config"), "value " + std::to_string(f->cache_config) + " is not a CUfunc_cache value (0 to 3)");
  return o.finish();
}

bool read_slots(Ctx& c, Obj& k, KernelNode* out) {
  const std::vector<Value>* slots = k.array("slots");
  for (size_t i = 0; slots != nullptr && i < slots->size() && c.ok(); ++i) {
    Obj s(c, &(*slots)[i], index_path(k.at("slots"), i));
    ParamSlot slot;
    s.u("offset", &slot.offset), s.u("size", &slot.size);
    if (s.finish()) out->slots.push_back(slot);
  }
  return c.ok();
}

bool read_attrs(Ctx& c, Obj& k, KernelNode* out) {
  const std::vector<Value>* attrs = k.array("attrs");
  for (size_t i = 0; attrs != nullptr && i < attrs->size() && c.ok(); ++i) {
    Obj a(c, &(*attrs)[i], index_path(k.at("attrs"), i));
    LaunchAttr attr;
    a.u("id", &attr.id), a.hex("value", kMaxLaunchAttrBytes, &attr.value);
    if (a.finish()) out->attrs.push_back(std::move(attr));
  }
  return c.ok();
}

bool read_kernel(Ctx& c, const Value* v, const std::string& path, KernelNode* k) {
  Obj o(c, v, path);
  o.hash("image", &k->image_hash);
  o.str("name", kMaxKernelNameBytes, &k->name);
  o.three("grid", k->grid);
  o.three("block", k->block);
  o.u("shared_mem", &k->shared_mem);
  o.hex("params", kMaxKernelParamBytes, &k->params);
  read_slots(c, o, k);
  read_attrs(c, o, k);
  read_func(c, o.get("func"), o.at("func"), &k->func);
  return o.finish();
}

bool read_memset(Ctx& c, const Value* v, const std::string& path, MemsetNode* m) {
  Obj o(c, v, path);
  o.u("dst", &m->dst), o.u("pitch", &m->pitch), o.u("value", &m->value);
  o.u("element_size", &m->element_size), o.u("width", &m->width), o.u("height", &m->height);
  return o.finish();
}

bool read_memcpy(Ctx& c, const Value* v, const std::string& path, MemcpyNode* m) {
  Obj o(c, v, path);
  for_each_memcpy_field(*m, [&](const char* key, uint64_t& x) { o.u(key, &x); });
  return o.finish();
}

bool read_collective(Ctx& c, const Value* v, const std::string& path, CollectiveNode* out) {
  Obj o(c, v, path);
  o.str("name", kMaxKernelNameBytes, &out->name);
  o.u("kernel", &out->kernel);
  const std::vector<Value>* calls = o.array("calls");
  for (size_t i = 0; calls != nullptr && i < calls->size() && c.ok(); ++i) {
    Obj call(c, &(*calls)[i], index_path(o.at("calls"), i));
    CollectiveCall x;
    for_each_call_field(x, [&](const char* key, auto& f) { call.u(key, &f); },
                        [&](const char* key, int32_t& f) { call.i32(key, &f); });
    if (x.op > kMaxCollectiveOp) c.fail(call.at("op"), "unknown collective operation " + std::to_string(x.op));
    if (call.finish()) out->calls.push_back(x);
  }
  if (c.ok() && out->calls.empty()) return c.fail(o.at("calls"), "a collective node needs at least one call");
  return o.finish();
}

bool kind_from_name(const std::string& name, NodeKind* out) {
  for (uint32_t k = 0; k <= static_cast<uint32_t>(NodeKind::kCollective); ++k) {
    if (name == node_kind_name(static_cast<NodeKind>(k))) {
      *out = static_cast<NodeKind>(k);
      return true;
    }
  }
  return false;
}

bool read_node(Ctx& c, const Value* v, const std::string& path, Node* n) {
  Obj o(c, v, path);
  std::string kind;
  if (!o.str("kind", 64, &kind)) return false;
  if (!kind_from_name(kind, &n->kind)) return c.fail(o.at("kind"), "unknown node kind \"" + kind + "\"");
  switch (n->kind) {
    case NodeKind::kKernel: read_kernel(c, o.get("kernel"), o.at("kernel"), &n->kernel); break;
    case NodeKind::kMemset: read_memset(c, o.get("memset"), o.at("memset"), &n->memset); break;
    case NodeKind::kMemcpy: read_memcpy(c, o.get("memcpy"), o.at("memcpy"), &n->memcpy); break;
    case NodeKind::kEventRecord:
    case NodeKind::kEventWait: o.u("event", &n->event); break;
    case NodeKind::kEmpty: break;
    case NodeKind::kChildGraph: o.u("child", &n->child); break;
    case NodeKind::kCollective: read_collective(c, o.get("collective"), o.at("collective"), &n->collective); break;
  }
  return o.finish();
}

bool read_edge(Ctx& c, const Value* v, const std::string& path, Edge* e) {
  Obj o(c, v, path);
  o.u("from", &e->from), o.u("to", &e->to), o.u("from_port", &e->from_port), o.u("to_port", &e->to_port);
  o.u("type", &e->type);
  return o.finish();
}

bool read_graph_json(Ctx& c, const Value* v, const std::string& path, int depth, GraphModel* g) {
  // Checked before descending, so nesting is bounded by the model's own limit, not only by the
  // JSON parser's.
  if (depth > kMaxGraphDepth)
    return c.fail(path, "child graphs nested deeper than " + std::to_string(kMaxGraphDepth) + " levels");
  Obj o(c, v, path);
  const std::vector<Value>* nodes = o.array("nodes");
  for (size_t i = 0; nodes != nullptr && i < nodes->size() && c.ok(); ++i) {
    g->nodes.emplace_back();
    read_node(c, &(*nodes)[i], index_path(o.at("nodes"), i), &g->nodes.back());
  }
  const std::vector<Value>* edges = o.array("edges");
  for (size_t i = 0; edges != nullptr && i < edges->size() && c.ok(); ++i) {
    g->edges.emplace_back();
    read_edge(c, &(*edges)[i], index_path(o.at("edges"), i), &g->edges.back());
  }
  const std::vector<Value>* children = o.array("children");
  for (size_t i = 0; children != nullptr && i < children->size() && c.ok(); ++i) {
    g->children.emplace_back();
    read_graph_json(c, &(*children)[i], index_path(o.at("children"), i), depth + 1, &g->children.back());
  }
  return o.finish();
}

bool read_member(Ctx& c, const Value* v, const std::string& path, PayloadMember* m) {
  Obj o(c, v, path);
  o.str("name", kMaxGraphName, &m->name);
  o.u("template", &m->template_index);
  const std::vector<Value>* delta = o.array("delta");
  for (size_t i = 0; delta != nullptr && i < delta->size() && c.ok(); ++i) {
    Obj d(c, &(*delta)[i], index_path(o.at("delta"), i));
    NodeDelta nd{0, Node{}};
    d.u("node", &nd.node);
    read_node(c, d.get("value"), d.at("value"), &nd.value);
    if (d.finish()) m->delta.push_back(std::move(nd));
  }
  const std::vector<Value>* refs = o.array("refs");
  for (size_t i = 0; refs != nullptr && i < refs->size() && c.ok(); ++i) {
    Obj r(c, &(*refs)[i], index_path(o.at("refs"), i));
    RegionRef ref;
    r.u("offset", &ref.offset), r.u("size", &ref.size), r.u("kind", &ref.kind);
    if (r.finish()) m->refs.push_back(ref);
  }
  return o.finish();
}

// Every kernel node of g (children included) with its path in the document.
void kernel_paths(const GraphModel& g, const std::string& path,
                  std::vector<std::pair<const KernelNode*, std::string>>* out) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].kind == NodeKind::kKernel) out->emplace_back(&g.nodes[i].kernel, index_path(path + ".nodes", i));
  for (size_t i = 0; i < g.children.size(); ++i) kernel_paths(g.children[i], index_path(path + ".children", i), out);
}

// The binary payload stores one cache preference per kernel (payload.h): a document giving one
// kernel two could not come back from the file as written.
Status check_one_cache_config_per_kernel(const Payload& p) {
  std::vector<std::pair<const KernelNode*, std::string>> kernels;
  for (size_t i = 0; i < p.templates.size(); ++i) kernel_paths(p.templates[i], index_path("templates", i), &kernels);
  for (size_t i = 0; i < p.members.size(); ++i)
    for (size_t d = 0; d < p.members[i].delta.size(); ++d)
      if (p.members[i].delta[d].value.kind == NodeKind::kKernel)
        kernels.emplace_back(&p.members[i].delta[d].value.kernel, index_path("members[" + std::to_string(i) + "].delta", d) + ".value");
  std::map<std::pair<uint64_t, std::string>, const std::pair<const KernelNode*, std::string>*> first;
  for (const auto& entry : kernels) {
    const KernelNode& k = *entry.first;
    auto [it, fresh] = first.try_emplace({k.image_hash, k.name}, &entry);
    int32_t seen = it->second->first->func.cache_config;
    if (fresh || seen == k.func.cache_config) continue;
    return Error(FOUNDRY_ERR_FORMAT, "payload JSON: " + entry.second + ".kernel.func.cache_config: " +
                                         std::to_string(k.func.cache_config) + ", but " + it->second->second +
                                         " runs the same kernel (" + k.name + ") with " + std::to_string(seen) +
                                         ": a kernel has one cache preference");
  }
  return Status::Ok();
}

Status prefixed(const std::string& where, const Status& s) {
  if (s.ok()) return s;
  return Error(s.code(), "payload JSON: " + where + ": " + s.message());
}

// What the binary reader checks beyond field types (param slots inside the buffer, memset element
// sizes, edge endpoints, child indices, delta nodes matching their template): templates and
// deltas go through the binary encoding and its own validating reader, so the two cannot disagree.
Status check_like_read_payload(const Payload& p) {
  if (p.members.size() > kMaxMembers)
    return Error(FOUNDRY_ERR_FORMAT, "payload JSON: more than " + std::to_string(kMaxMembers) + " graphs");
  for (size_t i = 0; i < p.templates.size(); ++i) {
    ByteWriter w;
    write_graph(w, p.templates[i]);
    ByteReader r(w.bytes().data(), w.size());
    GraphModel check;
    FOUNDRY_RETURN_IF_ERROR(prefixed("templates[" + std::to_string(i) + "]", read_graph(r, &check)));
  }
  for (size_t i = 0; i < p.members.size(); ++i) {
    const PayloadMember& m = p.members[i];
    std::string where = "members[" + std::to_string(i) + "]";
    if (m.template_index >= p.templates.size())
      return Error(FOUNDRY_ERR_FORMAT, "payload JSON: " + where + ".template: " + std::to_string(m.template_index) +
                                           " is not below the " + std::to_string(p.templates.size()) + " templates");
    GraphModel applied;
    FOUNDRY_RETURN_IF_ERROR(prefixed(where + ".delta", apply_delta(p.templates[m.template_index], m.delta, &applied)));
    // A delta may only change what LOAD writes into the template's nodes: the binary encoding stores nothing else.
    if (!same_topology(p.templates[m.template_index], applied))
      return Error(FOUNDRY_ERR_FORMAT, "payload JSON: " + where + ".delta changes the topology of template " +
                                           std::to_string(m.template_index) + " (launch attributes, cluster shapes, copy shapes or edges)");
    // The delta as LOAD will read it back (slots inside the parameters, and so on).
    ByteWriter w;
    write_delta(w, p.templates[m.template_index], m.delta);
    ByteReader r(w.bytes().data(), w.size());
    std::vector<NodeDelta> back;
    FOUNDRY_RETURN_IF_ERROR(prefixed(where + ".delta", read_delta(r, p.templates[m.template_index], &back)));
  }
  return check_one_cache_config_per_kernel(p);
}

}  // namespace

std::string payload_to_json(const Payload& p) {
  Value templates = Value::array();
  for (const GraphModel& g : p.templates) templates.push(graph_value(g));
  Value members = Value::array();
  for (const PayloadMember& m : p.members) members.push(member_value(m));
  Value v = Value::object();
  v.set("version", Value::u64(kPayloadJsonVersion))
      .set("region", Value::object().set("base", Value::u64(p.region_base)).set("size", Value::u64(p.region_size)))
      .set("event_count", Value::u64(p.event_count))
      .set("templates", std::move(templates))
      .set("members", std::move(members));
  return json::dump(v, 1) + "\n";
}

Result<Payload> payload_from_json(const std::string& text) {
  auto doc = json::parse(text);
  if (!doc.ok()) return Error(FOUNDRY_ERR_FORMAT, "payload JSON: " + doc.status().message());
  Ctx c;
  Payload p;
  Obj o(c, &doc.value(), "");
  uint32_t version = 0;
  if (o.u("version", &version) && (version < kOldestPayloadJsonVersion || version > kPayloadJsonVersion)) {
    return Error(FOUNDRY_ERR_VERSION, "payload JSON: version " + std::to_string(version) + ", this build reads " +
                                          std::to_string(kOldestPayloadJsonVersion) + " to " +
                                          std::to_string(kPayloadJsonVersion));
  }
  c.version = version;
  Obj region(c, o.get("region"), o.at("region"));
  region.u("base", &p.region_base), region.u("size", &p.region_size);
  region.finish();
  o.u("event_count", &p.event_count);
  const std::vector<Value>* templates = o.array("templates");
  for (size_t i = 0; templates != nullptr && i < templates->size() && c.ok(); ++i) {
    p.templates.emplace_back();
    read_graph_json(c, &(*templates)[i], index_path("templates", i), 0, &p.templates.back());
  }
  const std::vector<Value>* members = o.array("members");
  for (size_t i = 0; members != nullptr && i < members->size() && c.ok(); ++i) {
    p.members.emplace_back();
    read_member(c, &(*members)[i], index_path("members", i), &p.members.back());
  }
  o.finish();
  if (!c.ok()) return c.status();
  FOUNDRY_RETURN_IF_ERROR(check_like_read_payload(p));
  return p;
}

}  // namespace foundry
