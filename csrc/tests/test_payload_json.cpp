// payload_to_json / payload_from_json: exact round trip, and refusal (never a crash) of malformed
// documents; plus the JSON layer's number exactness and limits.
#include <string>

#include "common/json.h"
#include "graph/payload_json.h"
#include "graph/topology.h"
#include "tests/check.h"

using namespace foundry;

namespace {

Node kernel_node(uint64_t image, const std::string& name, uint32_t grid_x) {
  Node n;
  n.kind = NodeKind::kKernel;
  KernelNode& k = n.kernel;
  k.image_hash = image;
  k.name = name;
  k.grid[0] = grid_x, k.grid[1] = 2, k.grid[2] = 3;
  k.block[0] = 128;
  k.shared_mem = 4096;
  k.params = {0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0x2a, 0, 0, 0};
  k.slots = {{0, 8}, {8, 4}};
  k.attrs = {LaunchAttr{4, {1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0}}};
  k.func.max_dynamic_shared = 65536;
  k.func.preferred_carveout = -1;
  k.func.required_cluster[0] = 2;
  k.func.non_portable_cluster = 1;
  return n;
}

GraphModel child_graph() {
  GraphModel c;
  Node e;
  e.kind = NodeKind::kEmpty;
  c.nodes.push_back(e);
  Node ev;
  ev.kind = NodeKind::kEventWait;
  ev.event = 1;
  c.nodes.push_back(ev);
  c.edges.push_back(Edge{0, 1, 0, 0, 0});
  return c;
}

Payload sample() {
  Payload p;
  // Above 2^53: must survive JSON exactly.
  p.region_base = 0xfffff00000000000ull;
  p.region_size = 1ull << 40;
  p.event_count = 2;
  GraphModel t;
  t.nodes.push_back(kernel_node(0xdeadbeefcafef00dull, "_Z6kernelPfi", 7));
  Node ms;
  ms.kind = NodeKind::kMemset;
  ms.memset = MemsetNode{0xfffff00000001000ull, 256, 0xabcd, 2, 64, 4};
  t.nodes.push_back(ms);
  Node mc;
  mc.kind = NodeKind::kMemcpy;
  mc.memcpy.src = 0xfffff00000002000ull;
  mc.memcpy.dst = 0xfffff00000003000ull;
  mc.memcpy.width = 512;
  mc.memcpy.src_pitch = 1024;
  t.nodes.push_back(mc);
  Node rec;
  rec.kind = NodeKind::kEventRecord;
  rec.event = 0;
  t.nodes.push_back(rec);
  Node ch;
  ch.kind = NodeKind::kChildGraph;
  ch.child = 0;
  t.nodes.push_back(ch);
  Node coll;
  coll.kind = NodeKind::kCollective;
  coll.collective.name = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL";
  coll.collective.kernel = 1;
  CollectiveCall call;
  call.op = 2, call.comm = 3, call.send = 0x600000001000ull, call.recv = 0x600000002000ull, call.count = 1ull << 33;
  call.dtype = 9, call.redop = 0, call.root = -1, call.nranks = 8, call.rank = 7;
  coll.collective.calls = {call};
  t.nodes.push_back(coll);
  t.edges = {Edge{0, 1, 0, 0, 0}, Edge{1, 2, 0, 0, 1}, Edge{2, 3, 1, 0, 0}, Edge{3, 4, 0, 0, 0}, Edge{4, 5, 0, 0, 0}};
  t.children.push_back(child_graph());
  p.templates.push_back(t);

  PayloadMember a;
  a.name = "bs=1 \"quoted\" \xc3\xa9";
  a.template_index = 0;
  a.refs = {RegionRef{0, 4096, 1}, RegionRef{8192, 65536, 2}};
  p.members.push_back(a);
  PayloadMember b;
  b.name = "bs=2";
  b.template_index = 0;
  b.delta.push_back(NodeDelta{0, kernel_node(0xdeadbeefcafef00dull, "_Z6kernelPfi", 14)});
  p.members.push_back(b);
  return p;
}

bool payloads_equal(const Payload& a, const Payload& b) {
  if (a.region_base != b.region_base || a.region_size != b.region_size || a.event_count != b.event_count) return false;
  if (a.templates.size() != b.templates.size() || a.members.size() != b.members.size()) return false;
  for (size_t i = 0; i < a.templates.size(); ++i)
    if (!models_equal(a.templates[i], b.templates[i])) return false;
  for (size_t i = 0; i < a.members.size(); ++i) {
    const PayloadMember& x = a.members[i];
    const PayloadMember& y = b.members[i];
    if (x.name != y.name || x.template_index != y.template_index) return false;
    if (x.delta.size() != y.delta.size() || x.refs.size() != y.refs.size()) return false;
    GraphModel gx, gy;
    if (!apply_delta(a.templates[x.template_index], x.delta, &gx).ok()) return false;
    if (!apply_delta(b.templates[y.template_index], y.delta, &gy).ok()) return false;
    if (!models_equal(gx, gy)) return false;
    for (size_t k = 0; k < x.delta.size(); ++k)
      if (x.delta[k].node != y.delta[k].node) return false;
    for (size_t k = 0; k < x.refs.size(); ++k)
      if (x.refs[k].offset != y.refs[k].offset || x.refs[k].size != y.refs[k].size || x.refs[k].kind != y.refs[k].kind)
        return false;
  }
  return true;
}

bool mentions(const Status& s, const std::string& what) { return s.message().find(what) != std::string::npos; }

// Replaces the first occurrence of `from` in the sample's JSON and parses the result.
Status mutated(const std::string& from, const std::string& to) {
  std::string text = payload_to_json(sample());
  size_t at = text.find(from);
  if (at == std::string::npos) return Error(FOUNDRY_ERR_STATE, "test bug: '" + from + "' not in the document");
  text.replace(at, from.size(), to);
  return payload_from_json(text).status();
}

}  // namespace

TEST_CASE("round trip is exact") {
  Payload p = sample();
  std::string text = payload_to_json(p);
  auto back = payload_from_json(text);
  CHECK(back.ok());
  if (!back.ok()) std::fprintf(stderr, "%s\n", back.status().message().c_str());
  CHECK(payloads_equal(p, back.value()));
  // And the dump of the copy is byte-identical.
  CHECK_EQ(payload_to_json(back.value()), text);
  CHECK(text.find("\"image\": \"deadbeefcafef00d\"") != std::string::npos);
  CHECK(text.find("18446726481523507200") != std::string::npos);  // region base, exact
}

TEST_CASE("every truncation is refused without a crash") {
  std::string text = payload_to_json(sample());
  size_t refused = 0;
  for (size_t n = 0; n < text.size(); ++n) {
    auto r = payload_from_json(text.substr(0, n));
    // The only prefix that could parse is the document minus trailing whitespace.
    bool whole = text.find_first_not_of(" \n", n) == std::string::npos;
    if (!r.ok()) {
      ++refused;
      CHECK_EQ(r.status().code(), FOUNDRY_ERR_FORMAT);
    } else {
      CHECK(whole);
    }
  }
  CHECK(refused + 1 >= text.size());
}

TEST_CASE("every single-byte corruption is handled without a crash") {
  const std::string text = payload_to_json(sample());
  size_t accepted = 0;
  for (size_t at = 0; at < text.size(); ++at) {
    for (char c : {'"', '{', ']', '0', '9', '-', '\\', ',', '\x80'}) {
      if (text[at] == c) continue;
      std::string bad = text;
      bad[at] = c;
      auto r = payload_from_json(bad);
      if (r.ok()) {
        ++accepted;  // e.g. a digit changed inside a value: still a valid payload
        CHECK(payload_from_json(payload_to_json(r.value())).ok());
      } else {
        CHECK(r.status().code() == FOUNDRY_ERR_FORMAT || r.status().code() == FOUNDRY_ERR_VERSION);
      }
    }
  }
  CHECK(accepted > 0);
}

TEST_CASE("missing, mistyped and unknown fields are named") {
  Status s = mutated("\"shared_mem\"", "\"shared_memory\"");
  CHECK(!s.ok() && mentions(s, "templates[0].nodes[0].kernel.shared_mem: missing"));
  s = mutated("\"event_count\": 2", "\"event_count\": \"2\"");
  CHECK(!s.ok() && mentions(s, "event_count: expected an unsigned integer, found a string"));
  s = mutated("\"grid\": [7, 2, 3]", "\"grid\": [7, 2]");
  CHECK(!s.ok() && mentions(s, "templates[0].nodes[0].kernel.grid: expected 3 elements"));
  s = mutated("\"grid\": [7, 2, 3]", "\"grid\": [7, -2, 3]");
  CHECK(!s.ok() && mentions(s, "kernel.grid[1]: expected an unsigned integer, found a negative integer"));
  s = mutated("\"from_port\": 0", "\"from_port\": 256");
  CHECK(!s.ok() && mentions(s, "edges[0].from_port: value 256 out of range"));
  s = mutated("\"image\": \"deadbeefcafef00d\"", "\"image\": \"deadbeef\"");
  CHECK(!s.ok() && mentions(s, "kernel.image: expected 16 hex digits"));
  s = mutated("\"params\": \"00", "\"params\": \"0g");
  CHECK(!s.ok() && mentions(s, "kernel.params: not a hex string"));
  s = mutated("\"kind\": \"memset\"", "\"kind\": \"host\"");
  CHECK(!s.ok() && mentions(s, "unknown node kind \"host\""));
  s = mutated("\"event_count\": 2", "\"event_count\": 2, \"extra\": 1");
  CHECK(!s.ok() && mentions(s, "unknown field \"extra\""));
  s = mutated("\"event_count\": 2", "\"event_count\": 2.0");
  CHECK(!s.ok() && mentions(s, "found a number"));
  s = mutated("\"version\": 3", "\"version\": 9");
  CHECK(s.code() == FOUNDRY_ERR_VERSION && mentions(s, "this build reads 2 to 3"));
  s = mutated("\"version\": 3", "\"version\": 1");
  CHECK_EQ(s.code(), FOUNDRY_ERR_VERSION);
}

TEST_CASE("model checks of the binary reader apply") {
  // A slot past the parameter buffer, an edge to a missing node, a delta changing a node's kind,
  // a template index past the templates, a bad memset element size, a dangling child index.
  Status s = mutated("\"offset\": 8,", "\"offset\": 9,");
  CHECK(!s.ok() && mentions(s, "templates[0]") && mentions(s, "param slot"));
  s = mutated("\"to\": 1,", "\"to\": 99,");
  CHECK(!s.ok() && mentions(s, "endpoint"));
  s = mutated("\"template\": 0", "\"template\": 3");
  CHECK(!s.ok() && mentions(s, "members[0].template"));
  s = mutated("\"element_size\": 2", "\"element_size\": 3");
  CHECK(!s.ok() && mentions(s, "element size 3"));
  s = mutated("\"child\": 0", "\"child\": 5");
  CHECK(!s.ok() && mentions(s, "child graph index 5"));
  s = mutated("\"node\": 0,", "\"node\": 1,");
  CHECK(!s.ok() && mentions(s, "members[1].delta") && mentions(s, "template's is a memset node"));
}

TEST_CASE("a delta's kernel is checked as LOAD reads it") {
  // The delta may name another kernel with another parameter layout; a slot past its parameters
  // must be refused here as the binary reader refuses it.
  Payload p = sample();
  NodeDelta* kernel_delta = nullptr;
  for (PayloadMember& m : p.members)
    for (NodeDelta& d : m.delta)
      if (d.value.kind == NodeKind::kKernel && kernel_delta == nullptr) kernel_delta = &d;
  CHECK(kernel_delta != nullptr);
  if (kernel_delta == nullptr) return;
  KernelNode& k = kernel_delta->value.kernel;
  k.name = "_Z5otherPfS_";
  k.slots = {{0, static_cast<uint32_t>(k.params.size()) + 8}};
  auto r = payload_from_json(payload_to_json(p));
  CHECK(!r.ok() && mentions(r.status(), ".delta") && mentions(r.status(), "param slot"));
  k.slots = {{0, static_cast<uint32_t>(k.params.size())}};
  CHECK(payload_from_json(payload_to_json(p)).ok());
}

namespace {

// The sample with kernel _Z6kernelPfi (template node 0 and bs=2's delta) preferring L1.
Payload sample_with_cache_config() {
  Payload p = sample();
  p.templates[0].nodes[0].kernel.func.cache_config = kCachePreferL1;
  p.members[1].delta[0].value.kernel.func.cache_config = kCachePreferL1;
  return p;
}

// The document as version 2 wrote it: no cache_config fields.
std::string as_version_2(std::string text) {
  size_t v = text.find("\"version\": 3");
  if (v != std::string::npos) text.replace(v, 12, "\"version\": 2");
  for (size_t at; (at = text.find("\"cache_config\"")) != std::string::npos;) {
    size_t comma = text.rfind(',', at);
    size_t end = text.find_first_not_of("0123456789-", text.find(':', at) + 2);
    text.erase(comma, end - comma);
  }
  return text;
}

}  // namespace

TEST_CASE("a kernel's cache preference round trips through JSON") {
  std::string text = payload_to_json(sample_with_cache_config());
  CHECK(text.find("\"cache_config\": 2") != std::string::npos);
  auto back = payload_from_json(text);
  CHECK(back.ok());
  if (!back.ok()) return;
  CHECK_EQ(back.value().templates[0].nodes[0].kernel.func.cache_config, kCachePreferL1);
  CHECK_EQ(back.value().members[1].delta[0].value.kernel.func.cache_config, kCachePreferL1);
  CHECK_EQ(payload_to_json(back.value()), text);
}

TEST_CASE("a version 2 document reads with PREFER_NONE and may not name a cache preference") {
  std::string v2 = as_version_2(payload_to_json(sample_with_cache_config()));
  CHECK(v2.find("cache_config") == std::string::npos);
  auto r = payload_from_json(v2);
  CHECK(r.ok());
  if (!r.ok()) std::fprintf(stderr, "%s\n", r.status().message().c_str());
  if (r.ok()) {
    CHECK_EQ(r.value().templates[0].nodes[0].kernel.func.cache_config, kCachePreferNone);
    CHECK_EQ(payload_to_json(r.value()), payload_to_json(sample()));  // written back as version 3
  }
  // Version 2 had no such field: one there is refused as unknown, not silently read.
  std::string bad = v2;
  size_t at = bad.find("\"cluster_scheduling\": 0");
  bad.insert(at, "\"cache_config\": 1, ");
  r = payload_from_json(bad);
  CHECK(!r.ok() && mentions(r.status(), "templates[0].nodes[0].kernel.func: unknown field \"cache_config\""));
}

TEST_CASE("a cache preference outside CUfunc_cache, or two for one kernel, is refused") {
  std::string text = payload_to_json(sample_with_cache_config());
  std::string bad = text;
  bad.replace(bad.find("\"cache_config\": 2"), 17, "\"cache_config\": 4");
  auto r = payload_from_json(bad);
  CHECK(!r.ok() && mentions(r.status(), "templates[0].nodes[0].kernel.func.cache_config: value 4 is not a CUfunc_cache value"));
  bad = text;
  bad.replace(bad.find("\"cache_config\": 2"), 17, "\"cache_config\": -1");
  CHECK(!payload_from_json(bad).ok());
  // The delta runs the template's kernel with another preference: the file could not keep both.
  Payload p = sample_with_cache_config();
  p.members[1].delta[0].value.kernel.func.cache_config = kCachePreferShared;
  r = payload_from_json(payload_to_json(p));
  CHECK(!r.ok() && r.status().code() == FOUNDRY_ERR_FORMAT);
  CHECK(mentions(r.status(), "members[1].delta[0].value.kernel.func.cache_config: 1, but templates[0].nodes[0] runs the same kernel"));
}

TEST_CASE("json keeps integers exact and refuses bad documents") {
  auto v = json::parse("[18446744073709551615, -9223372036854775808, 9007199254740993, 1.5, 1e400]");
  CHECK(!v.ok());  // 1e400 is out of the double range
  v = json::parse("[18446744073709551615, -9223372036854775808, 9007199254740993, 1.5, 18446744073709551616]");
  CHECK(v.ok());
  uint64_t u = 0;
  int64_t i = 0;
  double d = 0;
  CHECK(v.value().items()[0].get_u64(&u) && u == 18446744073709551615ull);
  CHECK(v.value().items()[1].get_i64(&i) && i == INT64_MIN);
  CHECK(v.value().items()[2].get_u64(&u) && u == 9007199254740993ull);
  CHECK(!v.value().items()[3].get_u64(&u) && v.value().items()[3].get_double(&d) && d == 1.5);
  CHECK(!v.value().items()[4].get_u64(&u));  // beyond uint64: a double, not a wrapped integer
  CHECK_EQ(json::dump(v.value()), "[18446744073709551615,-9223372036854775808,9007199254740993,1.5,18446744073709551616.0]");

  for (const char* bad : {"", "01", "[1,]", "{\"a\":1,}", "{\"a\":1,\"a\":2}", "\"\\x\"", "\"\x01\"", "\"\xff\"",
                          "\"\\ud800\"", "tru", "[1 2]", "{1:2}", "1 2", "-", "1.", "1e", "nan"}) {
    auto r = json::parse(bad);
    CHECK(!r.ok());
    CHECK(r.status().message().find("at byte") != std::string::npos);
  }
  std::string deep(100, '[');
  deep += std::string(100, ']');
  auto r = json::parse(deep);
  CHECK(!r.ok() && mentions(r.status(), "nesting deeper"));
  CHECK(json::parse(deep, 200).ok());

  auto s = json::parse("\"a\\u00e9\\ud83d\\ude00\\n\"");
  CHECK(s.ok() && s.value().str() == "a\xc3\xa9\xf0\x9f\x98\x80\n");
  CHECK_EQ(json::dump(s.value()), "\"a\xc3\xa9\xf0\x9f\x98\x80\\n\"");
  CHECK_EQ(json::dump(json::Value::string("\xff")), "\"\\ufffd\"");
}

TEST_MAIN()
