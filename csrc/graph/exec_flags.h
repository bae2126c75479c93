// How Foundry instantiates every exec it makes: with the flags PyTorch's CUDAGraph uses for the
// graphs it captures (at::cuda::CUDAGraph::instantiate), so that a restored graph runs as the
// engine's own would. UseNodePriority makes the exec honour each kernel node's stored priority
// attribute instead of the launch stream's; AutoFreeOnLaunch only acts on allocation nodes, which
// Foundry refuses at SAVE, and is kept so that the two execs differ in nothing.
#pragma once

#include <cuda.h>

namespace foundry {

constexpr unsigned long long kExecInstantiateFlags =
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;

}  // namespace foundry
