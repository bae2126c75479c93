// libFuzzer target for the graph payload reader (graphs.fgr): container, header, kernel name
// table, kernel cache-config table, templates and members with their deltas and region references,
// as LOAD reads them (all at once, and the deltas later one by one)
// (built by scripts/build-fuzz; not a ctest). Inputs are resealed (reseal.h) so mutations reach
// the section decoders behind the checksums.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "archive/container.h"
#include "graph/payload.h"
#include "graph/topology.h"
#include "tests/fuzz/reseal.h"

namespace {

// models_equal leaves cache preferences out (they are per kernel, not per node): compared here.
bool same_cache_configs(const foundry::GraphModel& a, const foundry::GraphModel& b) {
  if (a.nodes.size() != b.nodes.size() || a.children.size() != b.children.size()) return false;
  for (size_t i = 0; i < a.nodes.size(); ++i)
    if (a.nodes[i].kind == foundry::NodeKind::kKernel &&
        a.nodes[i].kernel.func.cache_config != b.nodes[i].kernel.func.cache_config)
      return false;
  for (size_t i = 0; i < a.children.size(); ++i)
    if (!same_cache_configs(a.children[i], b.children[i])) return false;
  return true;
}

void parse(std::vector<uint8_t> bytes) {
  auto c = foundry::Container::parse(std::move(bytes), "fuzz");
  if (!c.ok()) return;
  auto p = foundry::parse_payload(c.value(), "fuzz");
  if (p.ok()) {
    // A payload that parses must be internally consistent: every member's template exists.
    for (const foundry::PayloadMember& m : p.value().members) {
      if (m.template_index >= p.value().templates.size()) __builtin_trap();
    }
  }
  // As lazy LOAD reads it: the deltas one by one, later. Read whole it must fail exactly when
  // one of the parts does.
  auto later = foundry::parse_payload(c.value(), "fuzz", foundry::DeltaRead::kLater);
  bool all_ok = later.ok();
  for (size_t i = 0; later.ok() && i < later.value().members.size(); ++i) {
    if (!foundry::read_pending_delta(&later.value(), i, "fuzz").ok()) all_ok = false;
  }
  if (all_ok != p.ok()) __builtin_trap();
  if (!all_ok) return;
  // And both read the same graphs.
  for (size_t i = 0; i < p.value().members.size(); ++i) {
    const foundry::PayloadMember& a = p.value().members[i];
    const foundry::PayloadMember& b = later.value().members[i];
    const foundry::GraphModel& t = p.value().templates[a.template_index];
    foundry::GraphModel ga, gb;
    bool applied = foundry::apply_delta(t, a.delta, &ga).ok();
    if (applied != foundry::apply_delta(t, b.delta, &gb).ok()) __builtin_trap();
    if ((applied && !foundry::models_equal(ga, gb)) || a.refs.size() != b.refs.size()) __builtin_trap();
    if (applied && !same_cache_configs(ga, gb)) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  foundry_fuzz::reseal(&bytes);
  parse(std::move(bytes));
  return 0;
}
