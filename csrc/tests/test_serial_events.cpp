// collective/serial_events.h: which archived events bracket NCCL launches (NCCL's serial event at
// SAVE), read from the graphs' structure: templates, members' deltas and child graphs.
#include <algorithm>
#include <vector>

#include "collective/serial_events.h"
#include "tests/check.h"
#include "tests/graph_nodes.h"

using namespace foundry;
using foundry_test::event_node;

namespace {

Node collective(uint32_t comm) {
  Node n;
  n.kind = NodeKind::kCollective;
  CollectiveCall c;
  c.comm = comm;
  c.count = 1024;
  n.collective.calls.push_back(c);
  return n;
}

Node kernel() { return foundry_test::simple_node(NodeKind::kKernel); }

std::vector<uint32_t> comms(const SerialEventUses& uses, uint32_t index) {
  std::vector<uint32_t> out;
  auto it = uses.find(index);
  if (it != uses.end())
    for (const CollectiveNode* c : it->second) out.push_back(c->calls.front().comm);
  std::sort(out.begin(), out.end());
  return out;
}

// wait(0) -> all-reduce on comm 0 -> record(0) -> kernel -> record(1), and a child graph whose
// wait(2) precedes an all-reduce on comm 5.
Payload payload() {
  Payload p;
  GraphModel t;
  t.nodes = {event_node(NodeKind::kEventWait, 0), collective(0), event_node(NodeKind::kEventRecord, 0), kernel(),
             event_node(NodeKind::kEventRecord, 1)};
  t.edges = {Edge{0, 1, 0, 0, 0}, Edge{1, 2, 0, 0, 0}, Edge{2, 3, 0, 0, 0}, Edge{3, 4, 0, 0, 0}};
  GraphModel child;
  child.nodes = {event_node(NodeKind::kEventWait, 2), collective(5)};
  child.edges = {Edge{0, 1, 0, 0, 0}};
  t.children.push_back(child);
  t.nodes.push_back(foundry_test::child_node(0));
  p.templates.push_back(t);
  p.event_count = 4;
  p.members.resize(2);
  // Member 1: its all-reduce on communicator 1, recorded on event 3.
  p.members[1].delta = {NodeDelta{1, collective(1)}, NodeDelta{2, event_node(NodeKind::kEventRecord, 3)}};
  return p;
}

}  // namespace

TEST_CASE("events that bracket a collective node, as each member's delta leaves its nodes") {
  Payload p = payload();
  SerialEventUses uses = nccl_serial_events(p);
  CHECK(comms(uses, 0) == (std::vector<uint32_t>{0, 0, 1}));  // waited on by both, recorded by member 0
  CHECK(comms(uses, 3) == (std::vector<uint32_t>{1}));        // recorded after member 1's all-reduce
  CHECK(comms(uses, 2) == (std::vector<uint32_t>{5, 5}));     // in the child graph, once per member
  CHECK(uses.count(1) == 0);                                  // recorded after a kernel: not NCCL's
  CHECK_EQ(uses.size(), 3u);
}

TEST_CASE("an event that also does something else is not NCCL's") {
  Payload p = payload();
  // Member 0's kernel now records event 0 as well: an application's event next to a collective.
  p.templates[0].nodes[4] = event_node(NodeKind::kEventRecord, 0);
  SerialEventUses uses = nccl_serial_events(p);
  CHECK(uses.count(0) == 0);
  CHECK(comms(uses, 3) == (std::vector<uint32_t>{1}));  // the others as before
  CHECK(comms(uses, 2) == (std::vector<uint32_t>{5, 5}));
}

TEST_CASE("no collective node, no NCCL event") {
  Payload p = payload();
  p.templates[0].nodes[1] = kernel();
  p.templates[0].children[0].nodes[1] = kernel();
  p.members[1].delta.clear();
  CHECK(nccl_serial_events(p).empty());
}

TEST_MAIN()
