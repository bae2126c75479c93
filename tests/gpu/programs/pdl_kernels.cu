// Test helpers built by the GPU tests with nvcc: a kernel pair launched with programmatic
// dependent launch (so stream capture records a programmatic edge), and a graph with a host node.
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void produce(const float* in, float* mid, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) mid[i] = in[i] * 2.0f + 1.0f;
  cudaTriggerProgrammaticLaunchCompletion();
}

__global__ void consume(const float* mid, float* out, int n) {
  cudaGridDependencySynchronize();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = mid[i] * mid[i];
}

extern "C" int launch_pair(void* stream, const float* in, float* mid, float* out, int n) {
  dim3 block(256), grid((n + 255) / 256);
  produce<<<grid, block, 0, (cudaStream_t)stream>>>(in, mid, n);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = (cudaStream_t)stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return (int)cudaLaunchKernelEx(&cfg, consume, (const float*)mid, out, n);
}

static void CUDART_CB host_fn(void*) {}

extern "C" void* make_host_graph(void) {
  cudaGraph_t g = nullptr;
  if (cudaGraphCreate(&g, 0) != cudaSuccess) return nullptr;
  cudaHostNodeParams p = {};
  p.fn = host_fn;
  cudaGraphNode_t node;
  if (cudaGraphAddHostNode(&node, g, nullptr, 0, &p) != cudaSuccess) return nullptr;
  return (void*)g;
}
