// Which of an archive's events are NCCL's serial event: with NCCL's graph mixing support (on by
// default) every captured NCCL launch is bracketed by a wait node and a record node on an event of
// NCCL's own (ncclStrongStream::serialEvent), which NCCL's eager launches record and wait on too,
// so that the kernels of graphs and of eager calls on one communicator never run at once. A
// restored graph must name the live process's event there, not a fresh one (docs/multi-gpu.md).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "graph/payload.h"

namespace foundry {

// Archived event index -> the collective nodes whose launch it brackets: an event wait node with
// an edge to a collective node, or an event record node with an edge from one, in any graph of
// the payload (each member's nodes as its delta leaves them, child graphs included). Only events
// all of whose wait and record nodes bracket a collective node are in the map (NCCL's serial
// event is used for nothing else). The payload's deltas must have been read.
using SerialEventUses = std::map<uint32_t, std::vector<const CollectiveNode*>>;
SerialEventUses nccl_serial_events(const Payload& p);

}  // namespace foundry
