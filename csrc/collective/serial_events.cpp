#include "collective/serial_events.h"

#include <functional>

namespace foundry {
namespace {

using NodeAt = std::function<const Node&(uint32_t)>;

struct Tally {
  SerialEventUses next_to;               // event -> collective nodes its bracketing nodes touch
  std::map<uint32_t, uint64_t> nodes;    // event -> its wait and record nodes
  std::map<uint32_t, uint64_t> brackets;  // event -> those of them that bracket a collective node
};

void count(const GraphModel& g, const NodeAt& at, Tally* t) {
  std::vector<bool> brackets(g.nodes.size(), false);
  for (const Edge& e : g.edges) {
    const Node& from = at(e.from);
    const Node& to = at(e.to);
    if (from.kind == NodeKind::kEventWait && to.kind == NodeKind::kCollective) {
      t->next_to[from.event].push_back(&to.collective);
      brackets[e.from] = true;
    }
    if (from.kind == NodeKind::kCollective && to.kind == NodeKind::kEventRecord) {
      t->next_to[to.event].push_back(&from.collective);
      brackets[e.to] = true;
    }
  }
  for (uint32_t j = 0; j < g.nodes.size(); ++j) {
    const Node& n = at(j);
    if (n.kind != NodeKind::kEventWait && n.kind != NodeKind::kEventRecord) continue;
    ++t->nodes[n.event];
    if (brackets[j]) ++t->brackets[n.event];
  }
  for (const GraphModel& c : g.children) count(c, [&c](uint32_t j) -> const Node& { return c.nodes[j]; }, t);
}

}  // namespace

SerialEventUses nccl_serial_events(const Payload& p) {
  Tally t;
  for (const PayloadMember& m : p.members) {
    const GraphModel& g = p.templates[m.template_index];
    std::map<uint32_t, const Node*> changed;
    for (const NodeDelta& d : m.delta) changed[d.node] = &d.value;
    count(g, [&](uint32_t j) -> const Node& {
      auto it = changed.find(j);
      return it != changed.end() ? *it->second : g.nodes[j];
    }, &t);
  }
  // Only events that never do anything else: an event of the application's that happens to sit
  // next to a collective somewhere is left alone.
  for (auto it = t.next_to.begin(); it != t.next_to.end();) {
    it = t.brackets[it->first] == t.nodes[it->first] ? std::next(it) : t.next_to.erase(it);
  }
  return t.next_to;
}

}  // namespace foundry
