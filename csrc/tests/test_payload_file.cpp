// The payload file: write_payload / read_payload round trip at a size parsed on several threads,
// errors reported for the first bad section in file order, as a serial parse would, deltas read
// later (lazy LOAD), and version 2 files.
#include <unistd.h>

#include <cstdio>
#include <string>
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
