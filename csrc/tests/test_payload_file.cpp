// The payload file: write_payload / read_payload round trip at a size parsed on several threads,
// and errors reported for the first bad section in file order, as a serial parse would.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "archive/bytes.h"
#include "archive/container.h"
#include "graph/payload.h"
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
  p.members.push_back(PayloadMember{"g", 0, {}, {}});
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
