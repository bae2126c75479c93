// What Foundry learns from the interposed NCCL entry points: the communicators in their order of
// creation (the ordinal is how SAVE and LOAD name the same communicator), and, during stream
// capture, which kernel nodes each collective launch added to the graph being captured.
//
// One per process, like the region: the interposed functions have no other place to keep it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "graph/model.h"

namespace foundry {

constexpr uint32_t kUnknownComm = UINT32_MAX;

class CollectiveLog {
 public:
  static CollectiveLog& instance();

  // Communicators: appended as NCCL creates them; a destroyed one keeps its ordinal, empty.
  void add_comm(void* comm);
  void remove_comm(void* comm);
  uint32_t ordinal(void* comm);  // kUnknownComm when Foundry did not see it created
  void* comm(uint32_t ordinal);  // nullptr when there is no such communicator
  uint32_t comm_count();

  // SAVE: the kernel nodes one launch (a call, or a group's calls) added to `graph`, the graph
  // being captured.
  void record(CUgraph graph, const std::vector<CUgraphNode>& kernels, std::vector<CollectiveCall> calls);
  // The launch that added `node` to `graph`; false when none did. Fills kernel and calls, not
  // the name. Keyed by both handles: the driver may reuse a destroyed graph's node handles.
  bool find(CUgraph graph, CUgraphNode node, CollectiveNode* out);
  uint64_t launches_recorded();

 private:
  struct Entry {
    uint32_t kernel = 0;
    std::shared_ptr<const std::vector<CollectiveCall>> calls;
  };
  std::mutex mu_;
  std::vector<void*> comms_;
  std::map<std::pair<CUgraph, CUgraphNode>, Entry> nodes_;
  uint64_t launches_ = 0;
};

}  // namespace foundry
