// The graph model: a captured CUgraph as plain data, with no driver handles. Kernels are named by
// (image hash, entry name), events by an index shared by the graphs of one archive, child graphs
// by value, NCCL's kernels by the calls that made them. Reader (CUgraph -> model), builder (model -> CUgraph), serializer and topology
// grouping all work on these structs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace foundry {

enum class NodeKind : uint32_t {
  kKernel = 0,
  kMemset = 1,
  kMemcpy = 2,
  kEventRecord = 3,
  kEventWait = 4,
  kEmpty = 5,
  kChildGraph = 6,
  kCollective = 7,
};

const char* node_kind_name(NodeKind kind);

// One parameter of a kernel: where it sits in KernelNode::params.
struct ParamSlot {
  uint32_t offset = 0;
  uint32_t size = 0;
};

// A kernel-node launch attribute (CUlaunchAttributeID and the raw bytes of its value).
struct LaunchAttr {
  uint32_t id = 0;
  std::vector<uint8_t> value;  // sizeof(CUlaunchAttributeValue) bytes
};

// CUfunc_cache (cuda.h), by value, so that the model needs no driver header.
constexpr int32_t kCachePreferNone = 0;  // the driver's default
constexpr int32_t kCachePreferShared = 1;
constexpr int32_t kCachePreferL1 = 2;
constexpr int32_t kCachePreferEqual = 3;

// Function attributes the restored kernel needs set before instantiation.
struct FunctionAttrs {
  int32_t max_dynamic_shared = 0;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  int32_t preferred_carveout = -1;  // -1: leave the default
  int32_t required_cluster[3] = {0, 0, 0};
  int32_t non_portable_cluster = 0;
  int32_t cluster_scheduling = 0;
  // The L1/shared split preferred with cuFuncSetCacheConfig (Triton asks for kCachePreferShared on
  // kernels above 48 KiB of shared memory). One per kernel, not per node: the node encoding leaves
  // it out, the payload stores it once per kernel (payload.h), and node comparisons ignore it.
  int32_t cache_config = kCachePreferNone;
};

struct KernelNode {
  uint64_t image_hash = 0;
  std::string name;  // mangled entry name
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_mem = 0;
  std::vector<uint8_t> params;   // the parameter buffer, laid out as the kernel expects
  std::vector<ParamSlot> slots;  // one per parameter
  std::vector<LaunchAttr> attrs;  // node attributes that differ from the defaults
  FunctionAttrs func;
};

struct MemsetNode {
  uint64_t dst = 0;
  uint64_t pitch = 0;
  uint32_t value = 0;
  uint32_t element_size = 1;  // 1, 2 or 4
  uint64_t width = 0;
  uint64_t height = 1;
};

// Device-to-device copy (CUDA_MEMCPY3D restricted to device memory).
struct MemcpyNode {
  uint64_t src = 0, dst = 0;
  uint64_t src_x = 0, src_y = 0, src_z = 0, src_pitch = 0, src_height = 0;
  uint64_t dst_x = 0, dst_y = 0, dst_z = 0, dst_pitch = 0, dst_height = 0;
  uint64_t width = 0, height = 1, depth = 1;
};

// One call into NCCL's collective API as SAVE saw it during capture. LOAD makes the same call
// again, under capture, on the communicator with the same ordinal, and takes the kernel node NCCL
// builds: NCCL's device state (its communicator, channels and peer buffers) lives at addresses
// only the live NCCL knows.
// The highest CollectiveOp value (collective/nccl_api.h); the payload readers refuse larger ones.
constexpr uint32_t kMaxCollectiveOp = 4;

struct CollectiveCall {
  uint32_t op = 0;    // CollectiveOp (collective/nccl_api.h)
  uint32_t comm = 0;  // communicator ordinal: its place in the process's order of creation
  uint64_t send = 0, recv = 0, count = 0;
  int32_t dtype = 0, redop = 0, root = 0;
  int32_t nranks = 0, rank = 0;  // the communicator's size and this process's rank in it
};

// A kernel node NCCL added for a launch (one call, or the calls of one group).
struct CollectiveNode {
  std::string name;    // NCCL's kernel at SAVE; LOAD checks that NCCL picks the same one
  uint32_t kernel = 0;  // which of the launch's kernel nodes this is
  std::vector<CollectiveCall> calls;
};

struct GraphModel;

struct Node {
  NodeKind kind = NodeKind::kEmpty;
  KernelNode kernel;        // kKernel
  MemsetNode memset;        // kMemset
  MemcpyNode memcpy;        // kMemcpy
  uint32_t event = 0;       // kEventRecord / kEventWait: index into the archive's events
  uint32_t child = 0;       // kChildGraph: index into GraphModel::children
  CollectiveNode collective;  // kCollective
};

// An edge with its CUgraphEdgeData (type 0 = full dependency, 1 = programmatic).
struct Edge {
  uint32_t from = 0;
  uint32_t to = 0;
  uint8_t from_port = 0;
  uint8_t to_port = 0;
  uint8_t type = 0;
};

struct GraphModel {
  std::vector<Node> nodes;
  std::vector<Edge> edges;  // sorted by (from, to, ports, type)
  std::vector<GraphModel> children;
};

}  // namespace foundry
