// LOAD: the driver's device memory for graph execs, grown ahead of the restore.
//
// Every live CUgraphExec holds device memory of the driver's own (about 3.5 KB per node for a
// decode graph on an H200), which the driver obtains while it instantiates: 8 of the 12 ms that a
// 1893-node graph's instantiation costs when earlier execs stay alive, as a start keeps them
// (scripts/instantiate_floor.py). The driver keeps that memory when an exec is destroyed and gives
// it to later execs of any graph. So instantiating stand-in graphs of the same sizes and
// destroying them, on a thread while the engine loads its weights, takes the growth off the
// restore's critical path. The stand-ins are chains of a no-op kernel: they need nothing the
// engine has made yet (no region block, no live NCCL), only the CUDA context.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "graph/model.h"

namespace foundry {

struct ExecWarmup {
  uint64_t graphs = 0;  // stand-ins asked for (graphs with nodes)
  uint64_t execs = 0;   // stand-in execs made (and destroyed): fewer when stopped
  uint64_t nodes = 0;   // nodes over the execs made
  double seconds = 0;
};

// Nodes of `g` once instantiated: child graphs are flattened into their parent's exec.
uint64_t flattened_nodes(const GraphModel& g);

// The node count of each graph of the payload at `payload_path` (its template's, flattened),
// read without the graphs' deltas (which do not change a graph's nodes).
Result<std::vector<uint64_t>> payload_graph_sizes(const std::string& payload_path);

// Instantiates one stand-in per entry of `node_counts` (a chain of that many no-op kernel
// nodes), keeps every exec alive until all are made (as a restore keeps its graphs), then
// destroys them. Stops before the next stand-in once `*stop` (when given) is non-zero: the
// restore, which would wait for it, has begun. Needs a current CUDA context (made current when
// none is).
Result<ExecWarmup> warm_exec_memory(std::vector<uint64_t> node_counts, const int* stop = nullptr);

}  // namespace foundry
