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

__global__ void axpb(const float* in, float* out, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * a + b;
}

// A graph whose only work sits in a child graph: out = (in * 3 + 1) * 0.5 - 2, in two kernels.
extern "C" void* make_child_graph(const float* in, float* mid, float* out, int n) {
  cudaGraph_t child = nullptr, parent = nullptr;
  if (cudaGraphCreate(&child, 0) != cudaSuccess || cudaGraphCreate(&parent, 0) != cudaSuccess) return nullptr;
  cudaKernelNodeParams p = {};
  float a1 = 3.0f, b1 = 1.0f, a2 = 0.5f, b2 = -2.0f;
  void* args1[] = {(void*)&in, (void*)&mid, &a1, &b1, &n};
  void* args2[] = {(void*)&mid, (void*)&out, &a2, &b2, &n};
  p.func = (void*)axpb;
  p.gridDim = dim3((n + 255) / 256);
  p.blockDim = dim3(256);
  p.kernelParams = args1;
  cudaGraphNode_t k1, k2, c;
  if (cudaGraphAddKernelNode(&k1, child, nullptr, 0, &p) != cudaSuccess) return nullptr;
  p.kernelParams = args2;
  if (cudaGraphAddKernelNode(&k2, child, &k1, 1, &p) != cudaSuccess) return nullptr;
  if (cudaGraphAddChildGraphNode(&c, parent, nullptr, 0, child) != cudaSuccess) return nullptr;
  cudaGraphDestroy(child);
  return (void*)parent;
}
