// The payload file: write_payload / read_payload round trip at a size parsed on several threads,
// errors reported for the first bad section in file order, as a serial parse would, deltas read
// later (lazy LOAD), version 2 files, and the optional kernel cache-config table.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "archive/bytes.h"
#include "archive/container.h"
#include "graph/payload.h"
#include "graph/serialize.h"
#include "graph/topology.h"
#include "tests/check.h"

using namespace foundry;

namespace {

GraphModel small_graph(uint32_t seed) {
  GraphModel g;
  for (uint32_t i = 0; i < 3; ++i) {
    Node n;
    n.kind = NodeKind::kKernel;
    n.kernel.image_hash = 0xabc;
    n.kernel.name = "_Z6kernel" + std::to_string(i);
    n.kernel.grid[0] = seed + i;
    n.kernel.params.assign(16, static_cast<uint8_t>(seed));
    n.kernel.slots = {{0, 8}, {8, 8}};
    g.nodes.push_back(n);
  }
  g.edges = {Edge{0, 1, 0, 0, 0}, Edge{1, 2, 0, 0, 0}};
  return g;
}

std::vector<uint8_t> header(uint32_t members, uint32_t templates) {
  ByteWriter h;
  h.u32(kPayloadVersion), h.u32(members), h.u32(templates), h.u32(0), h.u64(0), h.u64(0);
  return h.take();
}

}  // namespace

TEST_CASE("a payload with many sections round trips") {
  Payload p;
  p.region_base = 0x600000000000ull;
  p.region_size = 1ull << 30;
  for (uint32_t t = 0; t < 70; ++t) p.templates.push_back(small_graph(t));
  for (uint32_t m = 0; m < 100; ++m) {
    PayloadMember pm;
    pm.name = "bs=" + std::to_string(m);
    pm.template_index = m % 70;
    Node changed = p.templates[pm.template_index].nodes[1];
    changed.kernel.grid[0] = 1000 + m;
    pm.delta.push_back(NodeDelta{1, changed});
    pm.refs.push_back(RegionRef{m * 4096ull, 4096, 1});
    p.members.push_back(pm);
  }
  std::string path = "/tmp/foundry-test-payload-" + std::to_string(::getpid()) + ".fgr";
  CHECK(write_payload(path, p).ok());
  auto back = read_payload(path);
  std::remove(path.c_str());
  CHECK(back.ok());
  if (!back.ok()) return;
  const Payload& q = back.value();
  CHECK_EQ(q.templates.size(), 70u);
  CHECK_EQ(q.members.size(), 100u);
  for (size_t t = 0; t < q.templates.size(); ++t) CHECK(models_equal(q.templates[t], p.templates[t]));
  for (size_t m = 0; m < q.members.size(); ++m) {
    CHECK(q.members[m].name == p.members[m].name);
    CHECK_EQ(q.members[m].template_index, p.members[m].template_index);
    CHECK_EQ(q.members[m].delta.size(), 1u);
    CHECK_EQ(q.members[m].delta[0].value.kernel.grid[0], 1000 + m);
    CHECK_EQ(q.members[m].refs[0].offset, m * 4096ull);
  }
}

TEST_CASE("the first bad template in file order is the one reported") {
  ContainerWriter w;
  w.add(1, header(0, 64));
  ByteWriter names;
  names.u32(0);
  w.add(4, names.take());
  for (uint32_t t = 0; t < 64; ++t) {
    ByteWriter g;
    if (t == 5 || t == 40) {
      g.u32(1);
      g.u32(99);  // one node of an unknown kind
    } else {
      g.u32(0), g.u32(0), g.u32(0);  // an empty graph
    }
    w.add(2, g.take());
  }
  auto c = Container::parse(w.finish(), "test");
  CHECK(c.ok());
  if (!c.ok()) return;
  for (int round = 0; round < 20; ++round) {  // whichever thread gets there first
    auto p = parse_payload(c.value(), "test");
    CHECK(!p.ok());
    CHECK(p.status().message().find("template 5:") != std::string::npos);
  }
}

TEST_MAIN()

TEST_CASE("an event node past the payload's events is refused when read") {
  Payload p;
  p.templates.push_back(small_graph(1));
  Node wait;
  wait.kind = NodeKind::kEventWait;
  wait.event = 0;
  p.templates[0].nodes.push_back(wait);
  PayloadMember m;
  m.name = "g";
  p.members.push_back(m);
  std::string path = "/tmp/foundry-test-events-" + std::to_string(::getpid()) + ".fgr";
  p.event_count = 1;
  CHECK(write_payload(path, p).ok());
  CHECK(read_payload(path).ok());
  p.event_count = 0;  // the node now names an event the payload does not have
  CHECK(write_payload(path, p).ok());
  auto back = read_payload(path);
  std::remove(path.c_str());
  CHECK(!back.ok() && back.status().code() == FOUNDRY_ERR_FORMAT &&
        back.status().message().find("names event 0, but the payload has 0 events") != std::string::npos);
}

namespace {

// Two members of one template, each with a delta and a region block.
Payload two_members() {
  Payload p;
  p.event_count = 1;
  p.templates.push_back(small_graph(3));
  for (uint32_t m = 0; m < 2; ++m) {
    PayloadMember pm;
    pm.name = "bs=" + std::to_string(m);
    Node changed = p.templates[0].nodes[2];
    changed.kernel.grid[0] = 500 + m;
    pm.delta.push_back(NodeDelta{2, changed});
    pm.refs.push_back(RegionRef{(m + 1) * 8192ull, 8192, 1});
    p.members.push_back(pm);
  }
  return p;
}

Result<Container> written(const Payload& p, const std::string& tag) {
  std::string path = "/tmp/foundry-test-" + tag + "-" + std::to_string(::getpid()) + ".fgr";
  if (Status s = write_payload(path, p); !s.ok()) return s;
  auto c = Container::read_file(path);
  std::remove(path.c_str());
  return c;
}

}  // namespace

TEST_CASE("deltas read later: every graph's blocks now, each delta when asked") {
  auto c = written(two_members(), "later");
  CHECK(c.ok());
  if (!c.ok()) return;
  auto later = parse_payload(c.value(), "test", DeltaRead::kLater);
  CHECK(later.ok());
  if (!later.ok()) return;
  Payload& p = later.value();
  for (size_t m = 0; m < 2; ++m) {
    CHECK(p.members[m].delta_pending);
    CHECK(p.members[m].delta.empty());
    CHECK_EQ(p.members[m].refs.at(0).offset, (m + 1) * 8192ull);
  }
  CHECK(read_pending_delta(&p, 1, "test").ok());
  CHECK(!p.members[1].delta_pending);
  CHECK(p.members[0].delta_pending);  // only the one asked for
  CHECK_EQ(p.members[1].delta.size(), 1u);
  CHECK_EQ(p.members[1].delta[0].value.kernel.grid[0], 501u);
  CHECK(read_pending_delta(&p, 1, "test").ok());  // a second time: nothing to do
  CHECK_EQ(p.members[1].delta.size(), 1u);
  auto now = parse_payload(c.value(), "test");
  CHECK(now.ok() && !now.value().members[0].delta_pending && now.value().members[0].delta.size() == 1);
}

TEST_CASE("a bad delta read later is reported then, naming its graph") {
  Payload p = two_members();
  Node wait;
  wait.kind = NodeKind::kEventWait;
  p.templates[0].nodes.push_back(wait);
  Node bad = wait;
  bad.event = 7;  // the payload has one event
  p.members[1].delta.push_back(NodeDelta{3, bad});
  auto c = written(p, "bad-later");
  CHECK(c.ok());
  if (!c.ok()) return;
  auto later = parse_payload(c.value(), "test", DeltaRead::kLater);
  CHECK(later.ok());  // the deltas are not read yet
  if (!later.ok()) return;
  CHECK(read_pending_delta(&later.value(), 0, "test").ok());
  Status s = read_pending_delta(&later.value(), 1, "test");
  CHECK(!s.ok() && s.code() == FOUNDRY_ERR_FORMAT);
  CHECK(s.message().find("graph 1 (bs=1): an event node names event 7") != std::string::npos);
  auto now = parse_payload(c.value(), "test");  // read whole, the same error at once
  CHECK(!now.ok() && now.status().message().find("graph 1 (bs=1): an event node names event 7") != std::string::npos);
}

TEST_CASE("a payload whose templates launch NCCL is read whole even when deltas could wait") {
  Payload p = two_members();
  Node nccl;
  nccl.kind = NodeKind::kCollective;
  nccl.collective.name = "ncclDevKernel_AllReduce";
  CollectiveCall call;
  call.count = 1024, call.nranks = 2;
  nccl.collective.calls.push_back(call);
  p.templates[0].nodes.push_back(nccl);
  auto c = written(p, "nccl");
  CHECK(c.ok());
  if (!c.ok()) return;
  auto later = parse_payload(c.value(), "test", DeltaRead::kLater);
  CHECK(later.ok());
  if (!later.ok()) return;
  for (const PayloadMember& m : later.value().members) CHECK(!m.delta_pending && m.delta.size() == 1);
}

TEST_CASE("a version 2 payload (blocks after the delta) is still read") {
  Payload p = two_members();
  ContainerWriter w;
  ByteWriter h;
  h.u32(2), h.u32(2), h.u32(1), h.u32(p.event_count), h.u64(0), h.u64(0);
  w.add(1, h.take());
  NameTable names;
  ByteWriter t;
  write_graph(t, p.templates[0], &names);
  ByteWriter nw;
  write_names(nw, names);
  w.add(4, nw.take());
  w.add(2, t.take());
  for (const PayloadMember& m : p.members) {
    ByteWriter mw;
    mw.string(m.name);
    mw.u32(m.template_index);
    write_delta(mw, p.templates[0], m.delta);
    mw.u32(static_cast<uint32_t>(m.refs.size()));
    for (const RegionRef& r : m.refs) mw.u64(r.offset), mw.u64(r.size), mw.u32(r.kind);
    w.add(3, mw.take());
  }
  auto c = Container::parse(w.finish(), "v2");
  CHECK(c.ok());
  if (!c.ok()) return;
  auto later = parse_payload(c.value(), "v2", DeltaRead::kLater);
  CHECK(later.ok());
  if (!later.ok()) return;
  const PayloadMember& m = later.value().members[1];
  CHECK(!m.delta_pending);
  CHECK_EQ(m.delta.at(0).value.kernel.grid[0], 501u);
  CHECK_EQ(m.refs.at(0).offset, 2 * 8192ull);
}

namespace {

std::string later_path(const std::string& tag) {
  return "/tmp/foundry-test-" + tag + "-" + std::to_string(::getpid()) + ".fgr";
}

// two_members() written to `path`, read back with its deltas left for later; the container is
// dropped (as GraphSet::open drops it), so nothing of the file stays mapped.
Result<Payload> later_from_file(const std::string& path) {
  if (Status s = write_payload(path, two_members()); !s.ok()) return s;
  auto c = Container::read_file(path);
  if (!c.ok()) return c.status();
  return parse_payload(c.value(), path, DeltaRead::kLater);
}

}  // namespace

TEST_CASE("deltas read later from a file: nothing copied at open, each read again at first use") {
  std::string path = later_path("reread");
  auto later = later_from_file(path);
  CHECK(later.ok());
  if (!later.ok()) return;
  Payload& p = later.value();
  CHECK(p.pending_file != nullptr);
  CHECK(p.pending_bytes.empty());
  CHECK(p.members[0].delta_pending && p.members[1].delta_pending);
  CHECK(read_pending_delta(&p, 1, path).ok());
  CHECK(read_pending_delta(&p, 0, path).ok());
  CHECK_EQ(p.members[0].delta.at(0).value.kernel.grid[0], 500u);
  CHECK_EQ(p.members[1].delta.at(0).value.kernel.grid[0], 501u);
  std::remove(path.c_str());
}

TEST_CASE("a pending delta whose file was changed in place after open is refused at first use") {
  std::string path = later_path("changed");
  auto later = later_from_file(path);
  CHECK(later.ok());
  if (!later.ok()) return;
  Payload& p = later.value();
  const PayloadMember& m = p.members[1];
  // The last byte of graph 1's section: inside its delta, which was not decoded at open.
  int fd = ::open(path.c_str(), O_WRONLY);
  CHECK(fd >= 0);
  uint8_t flipped = 0xee;
  CHECK(::pwrite(fd, &flipped, 1, static_cast<off_t>(m.section.offset + m.section.size - 1)) == 1);
  ::close(fd);
  Status s = read_pending_delta(&p, 1, path);
  CHECK(!s.ok() && s.code() == FOUNDRY_ERR_MISMATCH);
  CHECK(s.message().find("graph 1 (bs=1): checksum mismatch") != std::string::npos);
  CHECK(s.message().find("the file changed after it was opened") != std::string::npos);
  CHECK(p.members[1].delta_pending && p.members[1].delta.empty());
  CHECK(read_pending_delta(&p, 0, path).ok());  // graph 0's section is as it was
  std::remove(path.c_str());
}

TEST_CASE("a pending delta whose file was truncated in place after open is an error, not a fault") {
  std::string path = later_path("truncated");
  auto later = later_from_file(path);
  CHECK(later.ok());
  if (!later.ok()) return;
  Payload& p = later.value();
  CHECK(::truncate(path.c_str(), static_cast<off_t>(p.members[1].section.offset + 1)) == 0);
  Status s = read_pending_delta(&p, 1, path);
  CHECK(!s.ok() && s.code() == FOUNDRY_ERR_IO);
  CHECK(s.message().find("truncated since") != std::string::npos);
  CHECK(read_pending_delta(&p, 0, path).ok());  // before the cut
  std::remove(path.c_str());
}

TEST_CASE("a pending delta is still read after a SAVE replaced the file") {
  std::string path = later_path("replaced");
  auto later = later_from_file(path);
  CHECK(later.ok());
  if (!later.ok()) return;
  Payload other = two_members();
  other.members[1].delta[0].value.kernel.grid[0] = 777;
  CHECK(write_payload(path, other).ok());  // renamed over the file held open
  Payload& p = later.value();
  CHECK(read_pending_delta(&p, 1, path).ok());
  CHECK_EQ(p.members[1].delta.at(0).value.kernel.grid[0], 501u);  // the file as it was opened
  std::remove(path.c_str());
}

TEST_CASE("a payload parsed from memory copies its pending deltas out") {
  std::string path = later_path("memory");
  CHECK(write_payload(path, two_members()).ok());
  auto fb = FileBytes::read(path, 1u << 20);
  std::remove(path.c_str());
  CHECK(fb.ok());
  if (!fb.ok()) return;
  auto c = Container::parse(std::vector<uint8_t>(fb.value().data(), fb.value().data() + fb.value().size()), "memory");
  CHECK(c.ok());
  if (!c.ok()) return;
  auto later = parse_payload(c.value(), "memory", DeltaRead::kLater);
  CHECK(later.ok());
  if (!later.ok()) return;
  Payload& p = later.value();
  CHECK(p.pending_file == nullptr);
  CHECK(!p.pending_bytes.empty());
  c = Result<Container>(Container());  // the copy outlives the container
  CHECK(read_pending_delta(&p, 1, "memory").ok());
  CHECK_EQ(p.members[1].delta.at(0).value.kernel.grid[0], 501u);
}

// ---- the kernel cache-config table -------------------------------------------------------------

namespace {

constexpr uint32_t kCacheTableType = 5;  // payload.cpp's kSectionCacheConfigs

// two_members() with kernel 1 preferring shared memory (every node that runs it), a child graph
// whose kernel prefers L1, and bs=1's delta running a fourth kernel that prefers an equal split.
Payload with_cache_configs() {
  Payload p = two_members();
  p.templates[0].nodes[1].kernel.func.cache_config = kCachePreferShared;
  GraphModel child = small_graph(9);
  for (size_t i = 0; i < child.nodes.size(); ++i) child.nodes[i].kernel.name = "_Z6child" + std::to_string(i);
  child.nodes[0].kernel.func.cache_config = kCachePreferL1;
  p.templates[0].children.push_back(child);
  Node child_node;
  child_node.kind = NodeKind::kChildGraph;
  p.templates[0].nodes.push_back(child_node);
  Node other = p.templates[0].nodes[0];
  other.kernel.name = "_Z5otherv";
  other.kernel.func.cache_config = kCachePreferEqual;
  p.members[0].delta.insert(p.members[0].delta.begin(), NodeDelta{0, other});
  return p;
}

// The container with section `type` replaced by `bytes` (or dropped when `drop`), sections kept
// in order; `extra` more copies of it appended.
Result<Container> with_section(const Container& c, uint32_t type, const std::vector<uint8_t>& bytes, bool drop = false,
                                int extra = 0) {
  ContainerWriter w;
  for (const Section& s : c.sections()) {
    ByteSpan data = c.data(s);
    if (s.type != type) w.add(s.type, std::vector<uint8_t>(data.data, data.data + data.size));
    else if (!drop) w.add(type, bytes);
  }
  for (int i = 0; i < extra; ++i) w.add(type, bytes);
  return Container::parse(w.finish(), "cfg.fgr");
}

std::vector<uint8_t> section_bytes(const Container& c, uint32_t type) {
  ByteSpan data = c.data(*c.find(type));
  return std::vector<uint8_t>(data.data, data.data + data.size);
}

std::vector<uint8_t> table_of(const std::vector<std::tuple<uint64_t, std::string, uint32_t>>& entries, uint32_t count) {
  ByteWriter w;
  w.u32(count);
  for (const auto& [hash, name, config] : entries) w.u64(hash), w.string(name), w.u32(config);
  return w.take();
}

int32_t config_of(const KernelNode& k) { return k.func.cache_config; }

}  // namespace

TEST_CASE("a preference that is not a CUfunc_cache value is left out of the table, so the file stays readable") {
  Payload p = with_cache_configs();
  p.templates[0].nodes[1].kernel.func.cache_config = 7;  // _Z6kernel1
  CacheConfigTable table = cache_config_table(p);
  CHECK(table.count({0xabc, "_Z6kernel1"}) == 0);
  CHECK_EQ(table.size(), 2u);
  auto c = written(p, "cache-configs-bad");
  CHECK(c.ok());
  if (!c.ok()) return;
  auto r = parse_payload(c.value(), "test", DeltaRead::kNow);
  CHECK(r.ok());
  if (r.ok()) CHECK_EQ(config_of(r.value().templates[0].nodes[1].kernel), kCachePreferNone);
}

TEST_CASE("kernel cache preferences are written once per kernel and read back into every node") {
  Payload p = with_cache_configs();
  CacheConfigTable table = cache_config_table(p);
  CHECK_EQ(table.size(), 3u);
  CHECK_EQ(table.at({0xabc, "_Z6kernel1"}), kCachePreferShared);
  CHECK_EQ(table.at({0xabc, "_Z6child0"}), kCachePreferL1);
  CHECK_EQ(table.at({0xabc, "_Z5otherv"}), kCachePreferEqual);
  auto c = written(p, "cache-configs");
  CHECK(c.ok());
  if (!c.ok()) return;
  CHECK_EQ(c.value().find_all(kCacheTableType).size(), 1u);
  for (DeltaRead mode : {DeltaRead::kNow, DeltaRead::kLater}) {
    auto r = parse_payload(c.value(), "test", mode);
    CHECK(r.ok());
    if (!r.ok()) return;
    Payload& q = r.value();
    for (size_t m = 0; m < q.members.size(); ++m) CHECK(read_pending_delta(&q, m, "test").ok());
    const GraphModel& t = q.templates[0];
    CHECK_EQ(config_of(t.nodes[0].kernel), kCachePreferNone);
    CHECK_EQ(config_of(t.nodes[1].kernel), kCachePreferShared);
    CHECK_EQ(config_of(t.nodes[2].kernel), kCachePreferNone);
    CHECK_EQ(config_of(t.children.at(0).nodes[0].kernel), kCachePreferL1);
    // bs=1 runs another kernel at node 0 (its own preference) and keeps node 2's kernel.
    CHECK_EQ(q.members[0].delta.at(0).value.kernel.name, std::string("_Z5otherv"));
    CHECK_EQ(config_of(q.members[0].delta[0].value.kernel), kCachePreferEqual);
    CHECK_EQ(config_of(q.members[1].delta.at(0).value.kernel), kCachePreferNone);
    CHECK(q.cache_configs == table);
  }
}

TEST_CASE("a payload without a cache-config table reads as PREFER_NONE everywhere") {
  // No kernel with a preference: the file is what older builds wrote, with no table.
  auto plain = written(two_members(), "no-cache-configs");
  CHECK(plain.ok() && plain.value().find(kCacheTableType) == nullptr);
  // An older writer's file for graphs whose kernels had preferences: the same without the table.
  auto full = written(with_cache_configs(), "cache-configs-dropped");
  CHECK(full.ok());
  if (!full.ok()) return;
  auto older = with_section(full.value(), kCacheTableType, {}, true);
  CHECK(older.ok());
  if (!older.ok()) return;
  auto r = parse_payload(older.value(), "older.fgr");
  CHECK(r.ok());
  if (!r.ok()) return;
  CHECK(r.value().cache_configs.empty());
  size_t kernels = 0;
  for_each_node(r.value(), [&](const Node& n) {
    if (n.kind != NodeKind::kKernel) return;
    ++kernels;
    CHECK_EQ(n.kernel.func.cache_config, kCachePreferNone);
  });
  CHECK_EQ(kernels, 9u);  // 3 template nodes, 3 in the child graph, bs=1's two delta nodes, bs=2's one
}

TEST_CASE("a corrupt cache-config table is refused, naming it") {
  auto good = written(with_cache_configs(), "cache-configs-bad");
  CHECK(good.ok());
  if (!good.ok()) return;
  const std::vector<uint8_t> table = section_bytes(good.value(), kCacheTableType);
  auto refused = [&](const std::vector<uint8_t>& bytes, const std::string& what, int extra = 0) {
    auto c = with_section(good.value(), kCacheTableType, bytes, false, extra);
    CHECK(c.ok());
    if (!c.ok()) return;
    for (DeltaRead mode : {DeltaRead::kNow, DeltaRead::kLater}) {
      auto r = parse_payload(c.value(), "cfg.fgr", mode);
      CHECK(!r.ok() && r.status().code() == FOUNDRY_ERR_FORMAT);
      if (!r.ok() && r.status().message().find(what) == std::string::npos)
        std::fprintf(stderr, "expected '%s' in: %s\n", what.c_str(), r.status().message().c_str());
      CHECK(!r.ok() && r.status().message().find("cfg.fgr: ") == 0);
      CHECK(!r.ok() && r.status().message().find(what) != std::string::npos);
    }
  };
  // Truncated: in the count, where the entries announced cannot fit any more, in the last byte.
  refused(std::vector<uint8_t>(table.begin(), table.begin() + 2), "truncated kernel cache-config table");
  refused(std::vector<uint8_t>(table.begin(), table.begin() + 40),
          "kernel cache-config table: element count 3 at offset 0 cannot fit in the 36 bytes that follow");
  refused(std::vector<uint8_t>(table.begin(), table.end() - 1), "truncated kernel cache-config table entry 2");
  // A count the bytes cannot hold, a name longer than any kernel name, bytes after the entries.
  refused(table_of({}, 1u << 30), "kernel cache-config table: element count 1073741824");
  std::vector<uint8_t> huge = table_of({{0xabc, "k", 1}}, 1);
  huge[12] = 0xff, huge[13] = 0xff, huge[14] = 0xff;  // the name's length
  refused(huge, "kernel cache-config table entry 0");
  std::vector<uint8_t> longer = table;
  longer.push_back(0);
  refused(longer, "kernel cache-config table: 1 bytes after its 3 entries");
  // A value that is not a CUfunc_cache, a kernel listed twice, two tables.
  refused(table_of({{0xabc, "_Z6kernel1", 7}}, 1),
          "kernel cache-config table entry 0 (kernel _Z6kernel1 of image 0000000000000abc): cache config 7 is not a "
          "CUfunc_cache value (0 to 3)");
  refused(table_of({{0xabc, "_Z6kernel1", 1}, {0xabc, "_Z6kernel1", 2}}, 2),
          "kernel cache-config table entry 1 (kernel _Z6kernel1 of image 0000000000000abc): a second entry");
  refused(table, "kernel cache-config table: the file holds 2 tables, one at most", 1);
  // The table itself intact: accepted.
  auto same = with_section(good.value(), kCacheTableType, table);
  CHECK(same.ok() && parse_payload(same.value(), "cfg.fgr").ok());
}

TEST_CASE("nodes of one kernel that disagree: the first preference other than PREFER_NONE is kept") {
  Payload p = with_cache_configs();
  p.members[1].delta.at(0).value.kernel.name = "_Z6kernel1";  // bs=2's delta now runs kernel 1 ...
  p.members[1].delta[0].value.kernel.func.cache_config = kCachePreferL1;  // ... with another preference
  CacheConfigTable table = cache_config_table(p);
  CHECK_EQ(table.at({0xabc, "_Z6kernel1"}), kCachePreferShared);  // the template's, met first
  auto c = written(p, "cache-configs-disagree");
  CHECK(c.ok());
  if (!c.ok()) return;
  auto r = parse_payload(c.value(), "test");
  CHECK(r.ok());
  if (r.ok()) CHECK_EQ(r.value().members[1].delta.at(0).value.kernel.func.cache_config, kCachePreferShared);
}

TEST_CASE("merging payloads keeps the kernels' cache preferences") {
  std::string a = "/tmp/foundry-test-merge-a-" + std::to_string(::getpid()) + ".fgr";
  std::string b = "/tmp/foundry-test-merge-b-" + std::to_string(::getpid()) + ".fgr";
  std::string out = "/tmp/foundry-test-merge-out-" + std::to_string(::getpid()) + ".fgr";
  Payload one = with_cache_configs();
  Payload two = with_cache_configs();
  CHECK(write_payload(a, one).ok() && write_payload(b, two).ok());
  uint32_t templates = 0;
  CHECK(merge_payloads({a, b}, out, &templates).ok());
  auto merged = read_payload(out);
  std::remove(a.c_str()), std::remove(b.c_str()), std::remove(out.c_str());
  CHECK(merged.ok());
  if (merged.ok()) CHECK(merged.value().cache_configs == cache_config_table(one));
}
