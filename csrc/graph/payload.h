// The graph payload file (graphs.fgr): one section container holding the templates whole and
// every graph as (template index, per-node delta, region blocks it needs).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "archive/container.h"
#include "common/status.h"
#include "graph/model.h"
#include "graph/reader.h"
#include "graph/topology.h"

namespace foundry {

constexpr uint32_t kPayloadVersion = 2;  // 2: kernel deltas may name another kernel

struct PayloadMember {
  std::string name;
  uint32_t template_index = 0;  // into Payload::templates
  std::vector<NodeDelta> delta;
  std::vector<RegionRef> refs;
};

struct Payload {
  uint64_t region_base = 0;
  uint64_t region_size = 0;
  uint32_t event_count = 0;
  std::vector<GraphModel> templates;
  std::vector<PayloadMember> members;
};

// Every node a payload holds: templates (child graphs included), then members' deltas.
void for_each_node(const Payload& p, const std::function<void(const Node&)>& visit);

Status write_payload(const std::string& path, const Payload& p);
Result<Payload> read_payload(const std::string& path);
// The same from a container already read and checked; `path` names it in errors.
Result<Payload> parse_payload(const Container& c, const std::string& path);
// Reads several payloads and writes one whose graphs are regrouped across all of them (so graphs
// saved one at a time share templates). Event indices are kept apart per input payload.
Status merge_payloads(const std::vector<std::string>& inputs, const std::string& output, uint32_t* templates);

}  // namespace foundry
