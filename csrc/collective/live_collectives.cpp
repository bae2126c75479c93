#include "collective/live_collectives.h"

#include <cstring>
#include <string>

#include "collective/nccl_api.h"
#include "driver/driver.h"

namespace foundry {
namespace {

std::vector<uint64_t> key_of(const std::vector<CollectiveCall>& calls) {
  std::vector<uint64_t> key;
  for (const CollectiveCall& c : calls) {
    key.insert(key.end(), {c.op, c.comm, c.send, c.recv, c.count, static_cast<uint32_t>(c.dtype),
                           static_cast<uint32_t>(c.redop), static_cast<uint32_t>(c.root),
                           static_cast<uint32_t>(c.nranks), static_cast<uint32_t>(c.rank)});
  }
  return key;
}

std::string function_name(const Driver* d, CUgraphNode node) {
  CUDA_KERNEL_NODE_PARAMS p{};
  const char* name = nullptr;
  if (d->cuGraphKernelNodeGetParams(node, &p) != CUDA_SUCCESS || d->cuFuncGetName(&name, p.func) != CUDA_SUCCESS ||
      name == nullptr)
    return "?";
  return name;
}

}  // namespace

LiveCollectives::~LiveCollectives() {
  const Driver* d = driver_if_open();
  if (d == nullptr) return;
  // NCCL frees what a captured launch owns (its persistent work) with the graph it was captured
  // into; a restored graph may still be running it.
  if (!launches_.empty()) d->cuCtxSynchronize();
  for (auto& [key, launch] : launches_)
    if (launch.graph != nullptr) d->cuGraphDestroy(launch.graph);
  if (stream_ != nullptr) d->cuStreamDestroy(stream_);
}

Status LiveCollectives::capture(const std::vector<CollectiveCall>& calls, Launch* out) {
  const Driver* d = driver_if_open();
  if (stream_ == nullptr)
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  // Relaxed: NCCL may do work that global capture mode forbids while it builds the launch.
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture"));
  Status issued = nccl::issue(calls, stream_);
  CUgraph graph = nullptr;
  CUresult ended = d->cuStreamEndCapture(stream_, &graph);
  if (!issued.ok()) {
    if (graph != nullptr) d->cuGraphDestroy(graph);
    return issued;
  }
  FOUNDRY_RETURN_IF_ERROR(cuda_check(ended, "cuStreamEndCapture of an NCCL launch"));
  out->graph = graph;
  size_t n = 0;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphGetNodes(graph, nullptr, &n), "cuGraphGetNodes"));
  std::vector<CUgraphNode> nodes(n);
  if (n) FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphGetNodes(graph, nodes.data(), &n), "cuGraphGetNodes"));
  bool one_event = true;
  for (CUgraphNode node : nodes) {
    CUgraphNodeType t;
    if (d->cuGraphNodeGetType(node, &t) != CUDA_SUCCESS) continue;
    if (t == CU_GRAPH_NODE_TYPE_KERNEL) out->kernels.push_back(node);
    CUevent e = nullptr;
    if (t == CU_GRAPH_NODE_TYPE_EVENT_RECORD) d->cuGraphEventRecordNodeGetEvent(node, &e);
    if (t == CU_GRAPH_NODE_TYPE_WAIT_EVENT) d->cuGraphEventWaitNodeGetEvent(node, &e);
    if (e == nullptr) continue;
    one_event = one_event && (out->serial == nullptr || out->serial == e);
    out->serial = e;
  }
  if (!one_event) out->serial = nullptr;
  return Status::Ok();
}

Result<CUgraphNode> LiveCollectives::kernel(const CollectiveNode& node) {
  std::lock_guard<std::mutex> lock(mu_);
  return kernel_locked(node);
}

Result<const LiveCollectives::Launch*> LiveCollectives::launch_locked(const CollectiveNode& node) {
  const Driver* d = driver_if_open();
  if (d == nullptr) return Error(FOUNDRY_ERR_NO_DRIVER, "the CUDA driver is not open");
  std::vector<uint64_t> key = key_of(node.calls);
  auto it = launches_.find(key);
  if (it == launches_.end()) {
    Launch launch;
    Status s = capture(node.calls, &launch);
    if (!s.ok()) {
      if (launch.graph != nullptr) d->cuGraphDestroy(launch.graph);
      return s;
    }
    it = launches_.emplace(std::move(key), std::move(launch)).first;
  }
  return &it->second;
}

Result<CUevent> LiveCollectives::serial_event(const CollectiveNode& node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto launch = launch_locked(node);
  if (!launch.ok()) return launch.status();
  return launch.value()->serial;
}

Result<CUgraphNode> LiveCollectives::kernel_locked(const CollectiveNode& node) {
  const Driver* d = driver_if_open();
  auto found = launch_locked(node);
  if (!found.ok()) return found.status();
  const Launch& launch = *found.value();
  std::string what = std::string("NCCL ") + nccl::op_name(node.calls.front().op) + " of " +
                     std::to_string(node.calls.front().count) + " elements";
  if (node.kernel >= launch.kernels.size()) {
    return Error(FOUNDRY_ERR_MISMATCH, what + ": NCCL now launches " + std::to_string(launch.kernels.size()) +
                                           " kernels where SAVE saw at least " + std::to_string(node.kernel + 1));
  }
  CUgraphNode live = launch.kernels[node.kernel];
  std::string name = function_name(d, live);
  if (name != node.name) {
    return Error(FOUNDRY_ERR_MISMATCH, what + ": NCCL now picks kernel " + name + " where SAVE had " + node.name +
                                           " (another NCCL version, topology or tuning)");
  }
  return live;
}

Status LiveCollectives::live_params(const CollectiveNode& node, CUgraphNode* live, CUDA_KERNEL_NODE_PARAMS* p) {
  auto found = kernel_locked(node);
  if (!found.ok()) return found.status();
  *live = found.value();
  *p = CUDA_KERNEL_NODE_PARAMS{};
  return cuda_check(driver_if_open()->cuGraphKernelNodeGetParams(*live, p), "cuGraphKernelNodeGetParams (NCCL)");
}

Status LiveCollectives::add(const CollectiveNode& node, CUgraph graph, CUgraphNode* out) {
  std::lock_guard<std::mutex> lock(mu_);
  CUgraphNode live = nullptr;
  CUDA_KERNEL_NODE_PARAMS p;
  FOUNDRY_RETURN_IF_ERROR(live_params(node, &live, &p));
  const Driver* d = driver_if_open();
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphAddKernelNode(out, graph, nullptr, 0, &p), "cuGraphAddKernelNode (NCCL)"));
  return cuda_check(d->cuGraphKernelNodeCopyAttributes(*out, live), "cuGraphKernelNodeCopyAttributes (NCCL)");
}

Status LiveCollectives::apply(const CollectiveNode& node, CUgraphNode dst) {
  std::lock_guard<std::mutex> lock(mu_);
  CUgraphNode live = nullptr;
  CUDA_KERNEL_NODE_PARAMS p;
  FOUNDRY_RETURN_IF_ERROR(live_params(node, &live, &p));
  const Driver* d = driver_if_open();
  // The node's cluster shape (NCCL launches in clusters on Hopper) is checked against its grid
  // at each step: one block per cluster fits any grid, then the live node's shape fits its own.
  CUlaunchAttributeValue cluster;
  std::memset(&cluster, 0, sizeof(cluster));
  if (d->cuGraphKernelNodeGetAttribute(dst, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &cluster) == CUDA_SUCCESS &&
      cluster.clusterDim.x * cluster.clusterDim.y * cluster.clusterDim.z > 1) {
    cluster.clusterDim.x = cluster.clusterDim.y = cluster.clusterDim.z = 1;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphKernelNodeSetAttribute(dst, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &cluster),
                                       "cuGraphKernelNodeSetAttribute (NCCL cluster)"));
  }
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphKernelNodeSetParams(dst, &p), "cuGraphKernelNodeSetParams (NCCL)"));
  return cuda_check(d->cuGraphKernelNodeCopyAttributes(dst, live), "cuGraphKernelNodeCopyAttributes (NCCL)");
}

}  // namespace foundry
