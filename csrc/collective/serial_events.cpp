#include "collective/serial_events.h"

#include <functional>

namespace foundry {
namespace {

using NodeAt = std::function<const Node&(uint32_t)>;

void find(const GraphModel& g, const NodeAt& at, SerialEventUses* out) {
  for (const Edge& e : g.edges) {
    const Node& from = at(e.from);
    const Node& to = at(e.to);
    if (from.kind == NodeKind::kEventWait && to.kind == NodeKind::kCollective) (*out)[from.event].push_back(&to.collective);
    if (from.kind == NodeKind::kCollective && to.kind == NodeKind::kEventRecord) (*out)[to.event].push_back(&from.collective);
  }
  for (const GraphModel& c : g.children) find(c, [&c](uint32_t j) -> const Node& { return c.nodes[j]; }, out);
}

}  // namespace

SerialEventUses nccl_serial_events(const Payload& p) {
  SerialEventUses out;
  for (const PayloadMember& m : p.members) {
    const GraphModel& t = p.templates[m.template_index];
    std::map<uint32_t, const Node*> changed;
    for (const NodeDelta& d : m.delta) changed[d.node] = &d.value;
    find(t, [&](uint32_t j) -> const Node& {
      auto it = changed.find(j);
      return it != changed.end() ? *it->second : t.nodes[j];
    }, &out);
  }
  return out;
}

}  // namespace foundry
