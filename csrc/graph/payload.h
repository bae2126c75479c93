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

// 2: kernel deltas may name another kernel. 3: a graph's region blocks come before its delta, so
// that a reader can take every graph's blocks and leave the deltas for later. Versions 2 and 3
// are read; 3 is written.
constexpr uint32_t kPayloadVersion = 3;
constexpr uint32_t kOldestPayloadVersion = 2;

struct PayloadMember {
  std::string name;
  uint32_t template_index = 0;  // into Payload::templates
  std::vector<NodeDelta> delta;
  std::vector<RegionRef> refs;
  // Left by parse_payload(DeltaRead::kLater): the delta's encoded bytes, at this offset of
  // Payload::pending_bytes.
  bool delta_pending = false;
  size_t pending_offset = 0, pending_size = 0;
};

struct Payload {
  uint64_t region_base = 0;
  uint64_t region_size = 0;
  uint32_t event_count = 0;
  std::vector<GraphModel> templates;
  std::vector<PayloadMember> members;
  // The deltas parse_payload(kLater) left unread, copied out of the file once its checksums were
  // checked: a file changed or truncated later cannot change or fault what is read.
  std::vector<uint8_t> pending_bytes;
};

// Every node a payload holds: templates (child graphs included), then members' deltas (those
// read; a pending delta is not visited).
void for_each_node(const Payload& p, const std::function<void(const Node&)>& visit);

// When parse_payload reads the graphs' deltas: all now, or each when read_pending_delta asks for
// it (LOAD then pays only for the graphs it instantiates). A version 2 payload, or one whose
// templates hold NCCL nodes (every collective is made again at open, in archive order), is read
// whole either way.
enum class DeltaRead { kNow, kLater };

Status write_payload(const std::string& path, const Payload& p);
Result<Payload> read_payload(const std::string& path);
// The same from a container already read and checked; `path` names it in errors.
Result<Payload> parse_payload(const Container& c, const std::string& path, DeltaRead deltas = DeltaRead::kNow);
// Reads member i's pending delta (no-op when it was read); errors name `path` and the graph.
Status read_pending_delta(Payload* p, size_t i, const std::string& path);
// Reads several payloads and writes one whose graphs are regrouped across all of them (so graphs
// saved one at a time share templates). Event indices are kept apart per input payload.
Status merge_payloads(const std::vector<std::string>& inputs, const std::string& output, uint32_t* templates);

}  // namespace foundry
