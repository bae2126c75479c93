// Builder: GraphModel -> CUgraph. Kernel entries are resolved through the registry (the images
// must be loaded), events come from the caller's table, NCCL's kernels from the live NCCL, edges
// keep their CUgraphEdgeData.
#pragma once

#include <cuda.h>

#include <vector>

#include "common/status.h"
#include "graph/model.h"

namespace foundry {

struct BuiltGraph {
  CUgraph graph = nullptr;
  std::vector<CUgraphNode> nodes;  // model node i -> its CUgraphNode
};

// Fills a driver kernel-node parameter struct from a model node. `arg_ptrs` receives one pointer
// per parameter into k.params and must outlive the use of `out`.
Status kernel_params(const KernelNode& k, CUDA_KERNEL_NODE_PARAMS* out, std::vector<void*>* arg_ptrs);
void memset_params(const MemsetNode& m, CUDA_MEMSET_NODE_PARAMS* out);
void memcpy_params(const MemcpyNode& m, CUDA_MEMCPY3D* out);

// Sets a kernel's function attributes for graph nodes: its dynamic shared memory limit raised to
// `max_dynamic_shared` (never lowered: the attribute is the process's, and another user of the
// function may need more), and with `first`, its carveout, non-portable cluster permission and
// cache preference (cuFuncSetCacheConfig, when SAVE's process had set one).
Status apply_function_attrs(const KernelNode& k, int32_t max_dynamic_shared, bool first);

class LiveCollectives;

// `live` supplies NCCL's kernel nodes; it may be null for graphs without collective nodes.
Result<BuiltGraph> build_graph(const GraphModel& model, const std::vector<CUevent>& events, CUcontext ctx,
                               LiveCollectives* live = nullptr);

}  // namespace foundry
