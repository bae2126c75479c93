// How Foundry instantiates every exec it makes: with the flags PyTorch's CUDAGraph uses for the
// graphs it captures (at::cuda::CUDAGraph::instantiate), so that a restored graph runs as the
// engine's own would. USE_NODE_PRIORITY makes the exec honour each kernel node's stored priority
// attribute instead of the launch stream's (FOUNDRY_NODE_PRIORITY=0 leaves it out, to compare);
// AUTO_FREE_ON_LAUNCH only acts on allocation nodes, which Foundry refuses at SAVE, and is kept so
// that the two execs differ in nothing.
#pragma once

#include <cuda.h>

#include "common/load_settings.h"

namespace foundry {

inline unsigned long long exec_instantiate_flags() {
  unsigned long long flags = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
  if (use_node_priority()) flags |= CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  return flags;
}

}  // namespace foundry
