// LOAD: NCCL's kernel nodes for the collective launches an archive recorded, made by the live NCCL.
// Each distinct launch is captured once into a graph of its own on a private stream; the restored
// graphs take the kernel nodes' parameters (function, launch shape, arguments with this process's
// communicator pointers) and attributes from there. NCCL ties what a captured launch needs beyond
// its arguments to the graph it was captured into, so those graphs live as long as this object.
#pragma once

#include <cuda.h>

#include <map>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "graph/model.h"

namespace foundry {

class LiveCollectives {
 public:
  LiveCollectives() = default;
  LiveCollectives(const LiveCollectives&) = delete;
  LiveCollectives& operator=(const LiveCollectives&) = delete;
  ~LiveCollectives();

  // The live kernel node standing for `node`, capturing its launch on first use. Fails with
  // FOUNDRY_ERR_MISMATCH when NCCL now builds another kernel than at SAVE (another NCCL version,
  // topology or tuning) or a communicator is missing.
  Result<CUgraphNode> kernel(const CollectiveNode& node);
  // Adds a kernel node to `graph` that is the live node's copy.
  Status add(const CollectiveNode& node, CUgraph graph, CUgraphNode* out);
  // Gives `dst` (a kernel node of a graph being restored) the live node's parameters and attributes.
  Status apply(const CollectiveNode& node, CUgraphNode dst);
  // The event NCCL brackets node's live launch with (its graph-mixing serial event,
  // collective/serial_events.h), owned by NCCL; nullptr when NCCL put no event node around it
  // (graph mixing off) or more than one event.
  Result<CUevent> serial_event(const CollectiveNode& node);
  size_t launches() const { return launches_.size(); }

 private:
  struct Launch {
    CUgraph graph = nullptr;
    std::vector<CUgraphNode> kernels;
    CUevent serial = nullptr;
  };
  Status capture(const std::vector<CollectiveCall>& calls, Launch* out);
  Result<CUgraphNode> kernel_locked(const CollectiveNode& node);  // caller holds mu_
  Result<const Launch*> launch_locked(const CollectiveNode& node);  // made on first use; caller holds mu_
  // The live kernel node for `node` and its parameters (valid while the node lives); caller holds mu_.
  Status live_params(const CollectiveNode& node, CUgraphNode* live, CUDA_KERNEL_NODE_PARAMS* p);

  std::mutex mu_;  // also guards reads of the live graphs: the driver does not synchronise one CUgraph
  CUstream stream_ = nullptr;
  std::map<std::vector<uint64_t>, Launch> launches_;
};

}  // namespace foundry
