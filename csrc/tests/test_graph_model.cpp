// Tests of the graph model layer: serialization (round trip, every truncation, random corruption,
// each validation rule), topology keys and grouping, and template deltas.
#include <cstdint>
#include <string>
#include <vector>

#include "archive/bytes.h"
#include "graph/model.h"
#include "graph/serialize.h"
#include "graph/topology.h"
#include "tests/check.h"
#include "tests/graph_nodes.h"

using namespace foundry;
using foundry_test::child_node;
using foundry_test::event_node;
using foundry_test::simple_node;

namespace {

// ---- synthetic models ----

Node kernel_node(const std::string& name, uint32_t grid_x, uint8_t param_fill) {
  Node n;
  n.kind = NodeKind::kKernel;
  n.kernel.image_hash = 0x1234567890abcdefULL;
  n.kernel.name = name;
  n.kernel.grid[0] = grid_x;
  n.kernel.block[0] = 128;
  n.kernel.shared_mem = 256;
  n.kernel.params.assign(16, param_fill);
  n.kernel.slots = {{0, 8}, {8, 4}, {12, 4}};
  LaunchAttr cluster;
  cluster.id = 4;  // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
  cluster.value.assign(64, 0);
  cluster.value[0] = 2;
  n.kernel.attrs.push_back(cluster);
  n.kernel.func.max_dynamic_shared = 1024;
  n.kernel.func.required_cluster[0] = 2;
  n.kernel.func.required_cluster[1] = 1;
  n.kernel.func.required_cluster[2] = 1;
  return n;
}

Node memset_node(uint64_t height, uint32_t element_size) {
  Node n;
  n.kind = NodeKind::kMemset;
  n.memset.dst = 0x7f0000001000ULL;
  n.memset.pitch = 4096;
  n.memset.value = 0xdeadbeef;
  n.memset.element_size = element_size;
  n.memset.width = 1000;
  n.memset.height = height;
  return n;
}

Node memcpy_node(uint64_t height, uint64_t depth) {
  Node n;
  n.kind = NodeKind::kMemcpy;
  MemcpyNode& m = n.memcpy;
  m.src = 0x7f0000100000ULL;
  m.dst = 0x7f0000200000ULL;
  m.src_x = 1, m.src_y = 2, m.src_z = 3, m.src_pitch = 512, m.src_height = 64;
  m.dst_x = 4, m.dst_y = 5, m.dst_z = 6, m.dst_pitch = 1024, m.dst_height = 32;
  m.width = 256, m.height = height, m.depth = depth;
  return n;
}

Node collective_node(uint64_t count, uint32_t kernel) {
  Node n;
  n.kind = NodeKind::kCollective;
  n.collective.name = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL";
  n.collective.kernel = kernel;
  CollectiveCall c;
  c.op = 0;
  c.comm = 1;
  c.send = 0x600000400000ULL;
  c.recv = 0x600000400000ULL;
  c.count = count;
  c.dtype = 9;
  c.redop = 0;
  c.root = -1;
  c.nranks = 2;
  c.rank = 1;
  n.collective.calls = {c, c};
  return n;
}

Edge edge(uint32_t from, uint32_t to, uint8_t from_port = 0, uint8_t to_port = 0, uint8_t type = 0) {
  Edge e;
  e.from = from;
  e.to = to;
  e.from_port = from_port;
  e.to_port = to_port;
  e.type = type;
  return e;
}

GraphModel child_model() {
  GraphModel c;
  c.nodes.push_back(kernel_node("_Z5childPf", 8, 0x11));
  c.nodes.push_back(memset_node(1, 1));
  c.edges.push_back(edge(0, 1));
  GraphModel grandchild;
  grandchild.nodes.push_back(simple_node(NodeKind::kEmpty));
  c.children.push_back(grandchild);
  c.nodes.push_back(child_node(0));
  c.edges.push_back(edge(1, 2));
  return c;
}

// Every node kind, memsets in 1D and 2D, a child graph and a programmatic edge with ports.
GraphModel full_model() {
  GraphModel g;
  g.nodes.push_back(kernel_node("_Z6kernelPfi", 4, 0xaa));        // 0
  g.nodes.push_back(memset_node(1, 4));                             // 1: 1D
  g.nodes.push_back(memset_node(8, 2));                             // 2: 2D
  g.nodes.push_back(memcpy_node(4, 2));                             // 3: 3D
  g.nodes.push_back(event_node(NodeKind::kEventRecord, 0));         // 4
  g.nodes.push_back(event_node(NodeKind::kEventWait, 1));           // 5
  g.nodes.push_back(simple_node(NodeKind::kEmpty));                 // 6
  g.nodes.push_back(child_node(0));                                 // 7
  g.nodes.push_back(kernel_node("_Z7consumerPf", 2, 0xbb));         // 8
  g.nodes.push_back(collective_node(4096, 0));                      // 9
  g.edges = {edge(0, 1), edge(0, 8, 1, 0, 1), edge(1, 2), edge(2, 3), edge(3, 4),
             edge(5, 6), edge(6, 7), edge(7, 8), edge(8, 9)};
  g.children.push_back(child_model());
  return g;
}

std::vector<uint8_t> serialize(const GraphModel& g) {
  ByteWriter w;
  write_graph(w, g);
  return w.take();
}

Status parse(const std::vector<uint8_t>& bytes, GraphModel* out, bool* at_end = nullptr) {
  ByteReader r(bytes.data(), bytes.size());
  Status st = read_graph(r, out);
  if (at_end) *at_end = r.at_end();
  return st;
}

Status parse_model(const GraphModel& g) {
  GraphModel out;
  return parse(serialize(g), &out);
}

// Deterministic pseudo-random numbers (xorshift64*), so failures reproduce.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ULL;
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
};

// ---- serialization ----

TEST_CASE("round trip reproduces the model") {
  GraphModel g = full_model();
  GraphModel back;
  bool at_end = false;
  Status st = parse(serialize(g), &back, &at_end);
  CHECK(st.ok());
  CHECK(at_end);
  CHECK(models_equal(g, back));
  CHECK_EQ(back.nodes.size(), 10u);
  CHECK_EQ(back.children.size(), 1u);
  CHECK_EQ(back.children[0].children.size(), 1u);
  CHECK_EQ(back.edges[1].type, 1);
  CHECK_EQ(back.edges[1].from_port, 1);
  CHECK(serialize(back) == serialize(g));
}

TEST_CASE("empty graph round trips") {
  GraphModel empty, back;
  back.nodes.push_back(simple_node(NodeKind::kEmpty));
  CHECK(parse(serialize(empty), &back).ok());
  CHECK(back.nodes.empty() && back.edges.empty() && back.children.empty());
}

TEST_CASE("fields of other kinds do not affect equality or the encoding") {
  GraphModel a = full_model();
  GraphModel b = a;
  b.nodes[4].kernel.name = "garbage";  // an event node's unused kernel part
  b.nodes[0].memset.width = 99;
  CHECK(models_equal(a, b));
  CHECK(serialize(a) == serialize(b));
  CHECK_EQ(topology_key(a), topology_key(b));
}

TEST_CASE("every truncation is refused") {
  std::vector<uint8_t> bytes = serialize(full_model());
  int accepted = 0, wrong_code = 0;
  for (size_t len = 0; len < bytes.size(); ++len) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(len));
    GraphModel out;
    Status st = parse(prefix, &out);
    if (st.ok()) ++accepted;
    else if (st.code() != FOUNDRY_ERR_FORMAT) ++wrong_code;
  }
  CHECK_EQ(accepted, 0);
  CHECK_EQ(wrong_code, 0);
}

TEST_CASE("random corruption never crashes") {
  std::vector<uint8_t> bytes = serialize(full_model());
  Rng rng{0x9e3779b97f4a7c15ULL};
  int parsed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bad = bytes;
    size_t flips = 1 + rng.below(4);
    for (size_t f = 0; f < flips; ++f) bad[rng.below(bad.size())] ^= static_cast<uint8_t>(1 + rng.below(255));
    if (iter % 4 == 0) bad.resize(rng.below(bad.size() + 1));
    GraphModel out;
    if (parse(bad, &out).ok()) {
      ++parsed;
      // What was accepted is valid: it must survive its own round trip.
      CHECK(parse_model(out).ok());
    }
  }
  // Pure noise, too.
  for (int iter = 0; iter < 5000; ++iter) {
    std::vector<uint8_t> noise(rng.below(256));
    for (uint8_t& b : noise) b = static_cast<uint8_t>(rng.next());
    GraphModel out;
    (void)parse(noise, &out);
  }
  std::printf("  corruption: %d of 20000 corrupted encodings still parsed\n", parsed);
}

TEST_CASE("a failed read leaves the output untouched") {
  GraphModel out = full_model();
  std::vector<uint8_t> bytes = serialize(child_model());
  bytes.pop_back();
  CHECK(!parse(bytes, &out).ok());
  CHECK(models_equal(out, full_model()));
}

TEST_CASE("validation refuses unknown kinds") {
  ByteWriter w;
  w.u32(1);   // one node
  w.u32(8);   // kind 8 does not exist
  w.u32(0);
  w.u32(0);
  GraphModel out;
  Status st = parse(w.take(), &out);
  CHECK(!st.ok());
  CHECK_EQ(st.code(), FOUNDRY_ERR_FORMAT);
  CHECK(st.message().find("unknown node kind 8") != std::string::npos);
}

TEST_CASE("validation refuses edge endpoints and child indices out of range") {
  GraphModel g = full_model();
  g.edges.push_back(edge(3, 10));
  CHECK(!parse_model(g).ok());
  g = full_model();
  g.edges.push_back(edge(10, 3));
  CHECK(!parse_model(g).ok());
  g = full_model();
  g.nodes[7].child = 1;  // only one child
  Status st = parse_model(g);
  CHECK(!st.ok());
  CHECK(st.message().find("child graph index") != std::string::npos);
  g = full_model();
  g.children[0].nodes[2].child = 5;  // inside the child graph
  CHECK(!parse_model(g).ok());
  // Event indices are not checked here.
  g = full_model();
  g.nodes[4].event = 123456;
  CHECK(parse_model(g).ok());
}

TEST_CASE("validation refuses param slots outside the parameters") {
  GraphModel g;
  g.nodes.push_back(kernel_node("k", 1, 0));
  CHECK(parse_model(g).ok());
  g.nodes[0].kernel.slots.push_back({12, 5});  // ends at 17 > 16
  CHECK(!parse_model(g).ok());
  g.nodes[0].kernel.slots.back() = {16, 0};  // empty slot at the very end: fine
  CHECK(parse_model(g).ok());
  g.nodes[0].kernel.slots.back() = {0xffffffffu, 2};  // would wrap in 32 bits
  CHECK(!parse_model(g).ok());
  g.nodes[0].kernel.slots.back() = {2, 0xffffffffu};
  CHECK(!parse_model(g).ok());
}

TEST_CASE("validation enforces size limits") {
  GraphModel g;
  g.nodes.push_back(kernel_node("k", 1, 0));
  g.nodes[0].kernel.attrs[0].value.assign(64, 1);
  CHECK(parse_model(g).ok());
  g.nodes[0].kernel.attrs[0].value.assign(65, 1);
  CHECK(!parse_model(g).ok());

  g = GraphModel();
  g.nodes.push_back(kernel_node("k", 1, 0));
  g.nodes[0].kernel.name.assign(64 * 1024, 'n');
  CHECK(parse_model(g).ok());
  g.nodes[0].kernel.name.push_back('n');
  CHECK(!parse_model(g).ok());

  g = GraphModel();
  g.nodes.push_back(kernel_node("k", 1, 0));
  g.nodes[0].kernel.params.assign(64 * 1024, 0);
  CHECK(parse_model(g).ok());
  g.nodes[0].kernel.params.push_back(0);
  CHECK(!parse_model(g).ok());
}

TEST_CASE("validation refuses memset element sizes other than 1, 2, 4") {
  for (uint32_t size : {0u, 1u, 2u, 3u, 4u, 8u}) {
    GraphModel g;
    g.nodes.push_back(memset_node(1, size));
    bool valid = size == 1 || size == 2 || size == 4;
    CHECK_EQ(parse_model(g).ok(), valid);
  }
}

TEST_CASE("validation limits child graph nesting") {
  // `levels` child graphs nested below the top graph.
  auto nested = [](int levels) {
    GraphModel g;
    g.nodes.push_back(simple_node(NodeKind::kEmpty));
    for (int i = 0; i < levels; ++i) {
      GraphModel parent;
      parent.nodes.push_back(child_node(0));
      parent.children.push_back(g);
      g = parent;
    }
    return g;
  };
  CHECK(parse_model(nested(kMaxGraphDepth)).ok());
  Status st = parse_model(nested(kMaxGraphDepth + 1));
  CHECK(!st.ok());
  CHECK_EQ(st.code(), FOUNDRY_ERR_FORMAT);
  // A read that starts deep counts from there.
  ByteWriter w;
  write_graph(w, nested(1));
  ByteReader r(w.bytes().data(), w.size());
  GraphModel out;
  CHECK(!read_graph(r, &out, kMaxGraphDepth).ok());
}

TEST_CASE("hostile counts are refused before allocating") {
  for (int which = 0; which < 3; ++which) {
    ByteWriter w;
    if (which >= 1) w.u32(0);  // no nodes
    if (which >= 2) w.u32(0);  // no edges
    w.u32(0xffffffffu);        // then an absurd node, edge or child count
    w.u64(0);
    GraphModel out;
    Status st = parse(w.take(), &out);
    CHECK(!st.ok());
    CHECK(st.message().find("count") != std::string::npos);
  }
  // An absurd slot count inside a kernel.
  ByteWriter w;
  w.u32(1);
  w.u32(static_cast<uint32_t>(NodeKind::kKernel));
  w.u64(0);
  w.string("k");
  for (int i = 0; i < 7; ++i) w.u32(1);
  w.blob(nullptr, 0);
  w.u32(0x7fffffffu);
  GraphModel out;
  CHECK(!parse(w.take(), &out).ok());
}

// ---- topology ----

GraphModel small_model() {
  GraphModel g;
  g.nodes.push_back(kernel_node("_Z8producerPf", 4, 0x01));
  g.nodes.push_back(memset_node(1, 4));
  g.nodes.push_back(memcpy_node(1, 1));
  g.nodes.push_back(kernel_node("_Z8consumerPf", 4, 0x02));
  g.nodes.push_back(event_node(NodeKind::kEventRecord, 0));
  g.nodes.push_back(child_node(0));
  g.edges = {edge(0, 1), edge(0, 3, 1, 0, 1), edge(1, 2), edge(2, 3), edge(3, 4), edge(4, 5)};
  g.children.push_back(child_model());
  return g;
}

bool same_group(const GraphModel& a, const GraphModel& b) {
  Grouping gr = group_graphs({&a, &b});
  return gr.template_of.size() == 2 && gr.template_of[1] == 0 && gr.templates.size() == 1;
}

// Different topology by every measure: key, exact comparison and grouping.
void check_different(const GraphModel& a, const GraphModel& b, const char* what) {
  bool ok = topology_key(a) != topology_key(b) && !same_topology(a, b) && !same_group(a, b);
  if (!ok) std::fprintf(stderr, "  not told apart: %s\n", what);
  CHECK(ok);
}

TEST_CASE("updatable fields keep the topology and the delta holds exactly the changed nodes") {
  GraphModel tmpl = small_model();
  GraphModel member = tmpl;
  member.nodes[0].kernel.grid[0] = 64;                 // kernel grid
  member.nodes[0].kernel.params[3] = 0xff;             // and params
  member.nodes[0].kernel.func.max_dynamic_shared = 99;
  member.nodes[1].memset.dst += 4096;                  // memset pointer
  member.nodes[1].memset.width = 7;
  member.nodes[4].event = 3;                           // event index
  CHECK_EQ(topology_key(tmpl), topology_key(member));
  CHECK(same_topology(tmpl, member));
  CHECK(!models_equal(tmpl, member));

  GraphModel third = tmpl;
  third.nodes[3].kernel.block[0] = 256;
  third.nodes[3].kernel.shared_mem = 0;
  third.nodes[2].memcpy.src += 64;
  third.nodes[3].kernel.func.preferred_carveout = 50;
  Grouping gr = group_graphs({&tmpl, &member, &third});
  CHECK(gr.templates == std::vector<uint32_t>({0}));
  CHECK(gr.template_of == std::vector<uint32_t>({0, 0, 0}));

  std::vector<NodeDelta> d = make_delta(tmpl, member);
  CHECK_EQ(d.size(), 3u);
  if (d.size() == 3) CHECK(d[0].node == 0 && d[1].node == 1 && d[2].node == 4);
  GraphModel rebuilt;
  CHECK(apply_delta(tmpl, d, &rebuilt).ok());
  CHECK(models_equal(rebuilt, member));

  std::vector<NodeDelta> d3 = make_delta(tmpl, third);
  CHECK_EQ(d3.size(), 2u);
  CHECK(apply_delta(tmpl, d3, &rebuilt).ok());
  CHECK(models_equal(rebuilt, third));

  CHECK(make_delta(tmpl, tmpl).empty());
}

static std::vector<uint8_t> encoded_delta(const GraphModel& tmpl, const GraphModel& member) {
  ByteWriter w;
  write_delta(w, tmpl, make_delta(tmpl, member));
  return w.take();
}

// The encoded delta reads back in full and, applied to tmpl, gives member.
static bool delta_restores(const GraphModel& tmpl, const std::vector<uint8_t>& bytes, const GraphModel& member) {
  ByteReader r(bytes.data(), bytes.size());
  std::vector<NodeDelta> back;
  GraphModel rebuilt;
  return read_delta(r, tmpl, &back).ok() && r.at_end() && apply_delta(tmpl, back, &rebuilt).ok() &&
         models_equal(rebuilt, member);
}

TEST_CASE("another kernel in a node is a delta: name, image and parameter layout round-trip") {
  GraphModel tmpl = small_model();
  GraphModel member = tmpl;
  member.nodes[3].kernel.name = "_Z8consumerPd";       // another kernel
  member.nodes[3].kernel.image_hash ^= 1;              // from another image
  member.nodes[3].kernel.params.resize(16, 0x5a);      // with another parameter layout
  member.nodes[3].kernel.slots = {{0, 8}, {8, 8}};
  member.nodes[0].kernel.grid[0] = 7;                  // a kernel that stays, with new launch dims
  CHECK(same_topology(tmpl, member));
  CHECK(same_group(tmpl, member));
  CHECK_EQ(make_delta(tmpl, member).size(), 2u);
  CHECK(delta_restores(tmpl, encoded_delta(tmpl, member), member));

  // The identity flag is 0 or 1; anything else is corruption.
  std::vector<uint8_t> bytes = encoded_delta(tmpl, member);
  // entry count (4) + node index (4): the first entry's flag byte follows.
  CHECK_EQ(bytes[8], 0u);  // node 0 keeps its kernel
  bytes[8] = 2;
  ByteReader r(bytes.data(), bytes.size());
  std::vector<NodeDelta> back;
  Status st = read_delta(r, tmpl, &back);
  CHECK(!st.ok() && st.message().find("identity flag") != std::string::npos);

  // A slot the new layout puts past the parameters is refused as in a template.
  GraphModel bad = member;
  bad.nodes[3].kernel.slots = {{0, 8}, {12, 8}};
  std::vector<uint8_t> bad_bytes = encoded_delta(tmpl, bad);
  ByteReader rb(bad_bytes.data(), bad_bytes.size());
  CHECK(!read_delta(rb, tmpl, &back).ok());
}

TEST_CASE("collective calls are updatable; the kernel slot is topology") {
  GraphModel tmpl;
  tmpl.nodes.push_back(kernel_node("_Z6kernelPfi", 4, 0xaa));
  tmpl.nodes.push_back(collective_node(4096, 0));
  tmpl.edges = {edge(0, 1)};
  GraphModel member = tmpl;
  member.nodes[1].collective.calls[0].count = 64;
  member.nodes[1].collective.name = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL128";
  CHECK(same_topology(tmpl, member));
  CHECK_EQ(make_delta(tmpl, member).size(), 1u);
  CHECK(delta_restores(tmpl, encoded_delta(tmpl, member), member));

  GraphModel other = tmpl;
  other.nodes[1].collective.kernel = 1;
  CHECK(!same_topology(tmpl, other));

  GraphModel empty_calls = tmpl;
  empty_calls.nodes[1].collective.calls.clear();
  CHECK_EQ(parse_model(empty_calls).code(), FOUNDRY_ERR_FORMAT);
  GraphModel bad_op = tmpl;
  bad_op.nodes[1].collective.calls[0].op = 99;
  CHECK(parse_model(bad_op).message().find("unknown operation 99") != std::string::npos);
}

TEST_CASE("delta encoding round trips and refuses truncation") {
  GraphModel tmpl = small_model();
  GraphModel member = tmpl;
  member.nodes[0].kernel.params.assign(16, 0x5a);
  member.nodes[2].memcpy.dst += 128;
  std::vector<uint8_t> bytes = encoded_delta(tmpl, member);
  CHECK(delta_restores(tmpl, bytes, member));
  GraphModel rebuilt;

  int accepted = 0;
  for (size_t len = 0; len < bytes.size(); ++len) {
    ByteReader pr(bytes.data(), len);
    std::vector<NodeDelta> out;
    if (read_delta(pr, tmpl, &out).ok()) ++accepted;
  }
  CHECK_EQ(accepted, 0);

  Rng rng{42};
  for (int iter = 0; iter < 5000; ++iter) {
    std::vector<uint8_t> bad = bytes;
    bad[rng.below(bad.size())] ^= static_cast<uint8_t>(1 + rng.below(255));
    ByteReader br(bad.data(), bad.size());
    std::vector<NodeDelta> out;
    if (read_delta(br, tmpl, &out).ok()) (void)apply_delta(tmpl, out, &rebuilt);
  }
}

TEST_CASE("deltas store only changed parameter bytes; name tables dedupe kernel names") {
  GraphModel tmpl = small_model();
  GraphModel member = tmpl;
  member.nodes[0].kernel.grid[0] += 7;
  if (member.nodes[0].kernel.params.size() >= 16) member.nodes[0].kernel.params[8] ^= 0xff;
  std::vector<NodeDelta> d = make_delta(tmpl, member);
  ByteWriter w;
  write_delta(w, tmpl, d);
  // entry count + node index + 7 launch words + 2 function words + params size + one run.
  CHECK(w.size() <= 4 + 4 + 7 * 4 + 2 * 4 + 8 + 8 + 16);
  ByteReader r(w.bytes().data(), w.size());
  std::vector<NodeDelta> back;
  CHECK(read_delta(r, tmpl, &back).ok());
  GraphModel rebuilt;
  CHECK(apply_delta(tmpl, back, &rebuilt).ok());
  CHECK(models_equal(rebuilt, member));

  NameTable names;
  ByteWriter g1, g2;
  write_graph(g1, tmpl, &names);
  write_graph(g2, tmpl, &names);
  ByteWriter plain;
  write_graph(plain, tmpl);
  CHECK(g1.size() <= plain.size());
  ByteWriter nt;
  write_names(nt, names);
  ByteReader nr(nt.bytes().data(), nt.size());
  std::vector<std::string> table;
  CHECK(read_names(nr, &table).ok());
  ByteReader gr(g2.bytes().data(), g2.size());
  GraphModel out;
  CHECK(read_graph(gr, &out, 0, &table).ok());
  CHECK(models_equal(out, tmpl));
  std::vector<std::string> short_table;
  ByteReader gr2(g2.bytes().data(), g2.size());
  CHECK(!read_graph(gr2, &out, 0, &short_table).ok());  // name index outside the table
}

TEST_CASE("non-updatable differences change the topology") {
  GraphModel base = small_model();
  GraphModel g;

  g = base;
  g.edges[1].type = 0;  // programmatic -> full
  check_different(base, g, "edge type");
  g = base;
  g.edges[1].from_port = 0;
  check_different(base, g, "edge from_port");
  g = base;
  g.edges[1].to_port = 2;
  check_different(base, g, "edge to_port");
  g = base;
  g.edges.pop_back();
  check_different(base, g, "edge removed");
  g = base;
  g.edges[0].to = 2;
  check_different(base, g, "edge retargeted");
  g = base;
  g.nodes[0].kernel.attrs[0].value[0] = 4;
  check_different(base, g, "cluster launch attribute value");
  g = base;
  g.nodes[0].kernel.attrs[0].id = 5;
  check_different(base, g, "launch attribute id");
  g = base;
  g.nodes[0].kernel.attrs.clear();
  check_different(base, g, "launch attribute removed");
  g = base;
  g.nodes[0].kernel.func.required_cluster[1] = 2;
  check_different(base, g, "required cluster");
  g = base;
  g.nodes[0].kernel.func.non_portable_cluster = 1;
  check_different(base, g, "non-portable cluster");
  g = base;
  g.nodes[0].kernel.func.cluster_scheduling = 1;
  check_different(base, g, "cluster scheduling");
  g = base;
  g.nodes[1].memset.height = 2;  // 1D -> 2D
  check_different(base, g, "memset 1D vs 2D");
  g = base;
  g.nodes[1].memset.element_size = 2;
  check_different(base, g, "memset element size");
  g = base;
  g.nodes[2].memcpy.height = 3;
  check_different(base, g, "memcpy 2D");
  g = base;
  g.nodes[2].memcpy.depth = 3;
  check_different(base, g, "memcpy 3D");
  g = base;
  g.nodes[4].kind = NodeKind::kEventWait;
  check_different(base, g, "event record vs wait");
  g = base;
  g.nodes.push_back(simple_node(NodeKind::kEmpty));
  check_different(base, g, "node count");
  g = base;
  g.children[0].nodes[0].kernel.grid[0] = 99;  // child graphs must be identical
  check_different(base, g, "child graph contents");

  // Within a dimension class the shape is updatable.
  g = base;
  g.nodes[1].memset.width = 1;
  g.nodes[2].memcpy.width = 1;
  CHECK(same_topology(base, g));
  CHECK_EQ(topology_key(base), topology_key(g));
}

TEST_CASE("grouping keeps first-appearance order") {
  GraphModel a = small_model();
  GraphModel a2 = a;
  a2.nodes[0].kernel.grid[0] = 2;
  GraphModel b = a;
  b.edges[1].type = 0;
  GraphModel c;  // an empty graph
  GraphModel b2 = b;
  b2.nodes[4].event = 9;
  Grouping gr = group_graphs({&b, &a, &c, &a2, &b2, &c});
  CHECK(gr.templates == std::vector<uint32_t>({0, 1, 2}));
  CHECK(gr.template_of == std::vector<uint32_t>({0, 1, 2, 1, 0, 2}));
  CHECK(group_graphs({}).templates.empty());
}

TEST_CASE("apply_delta refuses bad entries and leaves the output untouched") {
  GraphModel tmpl = small_model();
  GraphModel out = full_model();

  std::vector<NodeDelta> d = {{static_cast<uint32_t>(tmpl.nodes.size()), tmpl.nodes[0]}};
  Status st = apply_delta(tmpl, d, &out);
  CHECK(!st.ok());
  CHECK_EQ(st.code(), FOUNDRY_ERR_FORMAT);

  d = {{0, tmpl.nodes[0]}, {1, tmpl.nodes[0]}};  // node 1 is a memset, the delta a kernel
  st = apply_delta(tmpl, d, &out);
  CHECK(!st.ok());
  CHECK(st.message().find("kernel") != std::string::npos);

  d = {{5, child_node(3)}};  // child index past the template's children
  CHECK(!apply_delta(tmpl, d, &out).ok());

  CHECK(models_equal(out, full_model()));
}

}  // namespace

TEST_MAIN()
