#include "graph/builder.h"

#include <cstring>
#include <map>
#include <tuple>

#include "collective/live_collectives.h"
#include "common/log.h"
#include "driver/driver.h"
#include "modules/cache_configs.h"
#include "modules/registry.h"

namespace foundry {

Status kernel_params(const KernelNode& k, CUDA_KERNEL_NODE_PARAMS* out, std::vector<void*>* arg_ptrs) {
  auto func = Registry::instance().resolve(k.image_hash, k.name);
  if (!func.ok()) return func.status();
  std::memset(out, 0, sizeof(*out));
  out->func = func.value();
  out->gridDimX = k.grid[0], out->gridDimY = k.grid[1], out->gridDimZ = k.grid[2];
  out->blockDimX = k.block[0], out->blockDimY = k.block[1], out->blockDimZ = k.block[2];
  out->sharedMemBytes = k.shared_mem;
  arg_ptrs->clear();
  for (const ParamSlot& s : k.slots) arg_ptrs->push_back(const_cast<uint8_t*>(k.params.data()) + s.offset);
  out->kernelParams = arg_ptrs->empty() ? nullptr : arg_ptrs->data();
  return Status::Ok();
}

void memset_params(const MemsetNode& m, CUDA_MEMSET_NODE_PARAMS* out) {
  std::memset(out, 0, sizeof(*out));
  out->dst = m.dst, out->pitch = m.pitch, out->value = m.value, out->elementSize = m.element_size;
  out->width = m.width, out->height = m.height;
}

void memcpy_params(const MemcpyNode& m, CUDA_MEMCPY3D* out) {
  std::memset(out, 0, sizeof(*out));
  out->srcMemoryType = CU_MEMORYTYPE_DEVICE, out->dstMemoryType = CU_MEMORYTYPE_DEVICE;
  out->srcDevice = m.src, out->dstDevice = m.dst;
  out->srcXInBytes = m.src_x, out->srcY = m.src_y, out->srcZ = m.src_z, out->srcPitch = m.src_pitch, out->srcHeight = m.src_height;
  out->dstXInBytes = m.dst_x, out->dstY = m.dst_y, out->dstZ = m.dst_z, out->dstPitch = m.dst_pitch, out->dstHeight = m.dst_height;
  out->WidthInBytes = m.width, out->Height = m.height, out->Depth = m.depth;
}

static_assert(kCachePreferNone == CU_FUNC_CACHE_PREFER_NONE && kCachePreferShared == CU_FUNC_CACHE_PREFER_SHARED &&
                  kCachePreferL1 == CU_FUNC_CACHE_PREFER_L1 && kCachePreferEqual == CU_FUNC_CACHE_PREFER_EQUAL,
              "the model stores CUfunc_cache by value");

// The archived copy of a kernel starts with the driver's default preference; SAVE's process had
// set another one (Triton: PREFER_SHARED above 48 KiB of shared memory). Launching with another
// L1/shared split than the captured graph would change how the kernel runs, and the driver may
// synchronize between launches of differing preferences. Only a preference: a refusal is logged,
// the graph still runs correctly.
static void apply_cache_config(const KernelNode& k, CUfunction func) {
  if (k.func.cache_config == kCachePreferNone) return;
  CUresult r = driver_if_open()->cuFuncSetCacheConfig(func, static_cast<CUfunc_cache>(k.func.cache_config));
  if (r != CUDA_SUCCESS) {
    LOG_WARNING("%s", cuda_error(r, ("cuFuncSetCacheConfig(" + std::to_string(k.func.cache_config) + ") for " + k.name).c_str())
                          .message().c_str());
    return;
  }
  // Noted as the interposer notes the application's calls, so a later SAVE of this process keeps it.
  CUmodule owner = nullptr;
  if (driver_if_open()->cuFuncGetModule(&owner, func) != CUDA_SUCCESS) owner = nullptr;
  CacheConfigLog::instance().note_function(func, owner, k.func.cache_config);
  LOG_DEBUG("cache preference %d set on %s", k.func.cache_config, k.name.c_str());
}

Status apply_function_attrs(const KernelNode& k, int32_t max_dynamic_shared, bool first) {
  auto func = Registry::instance().resolve(k.image_hash, k.name);
  if (!func.ok()) return func.status();
  const Driver* d = driver_if_open();
  int current = 0;
  if (d->cuFuncGetAttribute(&current, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, func.value()) != CUDA_SUCCESS) current = 0;
  if (max_dynamic_shared > current) {
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuFuncSetAttribute(func.value(), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                             max_dynamic_shared),
                                       ("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) for " + k.name).c_str()));
  }
  if (!first) return Status::Ok();
  if (k.func.non_portable_cluster > 0) {
    d->cuFuncSetAttribute(func.value(), CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
  }
  if (k.func.preferred_carveout >= 0) {
    d->cuFuncSetAttribute(func.value(), CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, k.func.preferred_carveout);
  }
  apply_cache_config(k, func.value());
  return Status::Ok();
}

static Status add_kernel(const KernelNode& k, CUgraph g, CUgraphNode* node) {
  const Driver* d = driver_if_open();
  CUDA_KERNEL_NODE_PARAMS p;
  std::vector<void*> args;
  FOUNDRY_RETURN_IF_ERROR(kernel_params(k, &p, &args));
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphAddKernelNode(node, g, nullptr, 0, &p), ("cuGraphAddKernelNode for " + k.name).c_str()));
  bool has_cluster = false;
  for (const LaunchAttr& a : k.attrs) {
    CUlaunchAttributeValue v;
    std::memset(&v, 0, sizeof(v));
    std::memcpy(&v, a.value.data(), std::min(a.value.size(), sizeof(v)));
    if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) has_cluster = true;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphKernelNodeSetAttribute(*node, static_cast<CUkernelNodeAttrID>(a.id), &v),
                                       ("cuGraphKernelNodeSetAttribute for " + k.name).c_str()));
  }
  // Kernels compiled with a required cluster shape (cuBLAS nvjet on Hopper) must launch with it.
  if (!has_cluster && k.func.required_cluster[0] > 0) {
    CUlaunchAttributeValue v;
    std::memset(&v, 0, sizeof(v));
    v.clusterDim.x = k.func.required_cluster[0];
    v.clusterDim.y = k.func.required_cluster[1] > 0 ? k.func.required_cluster[1] : 1;
    v.clusterDim.z = k.func.required_cluster[2] > 0 ? k.func.required_cluster[2] : 1;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphKernelNodeSetAttribute(*node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v),
                                       "cuGraphKernelNodeSetAttribute(CLUSTER_DIMENSION)"));
  }
  return Status::Ok();
}

static Status build_into(const GraphModel& model, const std::vector<CUevent>& events, CUcontext ctx,
                         LiveCollectives* live, BuiltGraph* out) {
  const Driver* d = driver_if_open();
  out->nodes.resize(model.nodes.size());
  for (size_t i = 0; i < model.nodes.size(); ++i) {
    const Node& n = model.nodes[i];
    CUgraphNode* node = &out->nodes[i];
    switch (n.kind) {
      case NodeKind::kKernel:
        FOUNDRY_RETURN_IF_ERROR(add_kernel(n.kernel, out->graph, node));
        break;
      case NodeKind::kMemset: {
        CUDA_MEMSET_NODE_PARAMS p;
        memset_params(n.memset, &p);
        FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphAddMemsetNode(node, out->graph, nullptr, 0, &p, ctx), "cuGraphAddMemsetNode"));
        break;
      }
      case NodeKind::kMemcpy: {
        CUDA_MEMCPY3D p;
        memcpy_params(n.memcpy, &p);
        FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphAddMemcpyNode(node, out->graph, nullptr, 0, &p, ctx), "cuGraphAddMemcpyNode"));
        break;
      }
      case NodeKind::kEventRecord:
      case NodeKind::kEventWait: {
        if (n.event >= events.size()) return Error(FOUNDRY_ERR_FORMAT, "event index out of range");
        CUresult r = n.kind == NodeKind::kEventRecord ? d->cuGraphAddEventRecordNode(node, out->graph, nullptr, 0, events[n.event])
                                                      : d->cuGraphAddEventWaitNode(node, out->graph, nullptr, 0, events[n.event]);
        FOUNDRY_RETURN_IF_ERROR(cuda_check(r, "cuGraphAddEvent*Node"));
        break;
      }
      case NodeKind::kEmpty:
        FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphAddEmptyNode(node, out->graph, nullptr, 0), "cuGraphAddEmptyNode"));
        break;
      case NodeKind::kCollective:
        if (live == nullptr) return Error(FOUNDRY_ERR_STATE, "a collective node needs the live NCCL to build");
        FOUNDRY_RETURN_IF_ERROR(live->add(n.collective, out->graph, node));
        break;
      case NodeKind::kChildGraph: {
        if (n.child >= model.children.size()) return Error(FOUNDRY_ERR_FORMAT, "child graph index out of range");
        auto child = build_graph(model.children[n.child], events, ctx, live);
        if (!child.ok()) return child.status();
        // The driver clones the child into the node, so ours is destroyed right after.
        CUresult r = d->cuGraphAddChildGraphNode(node, out->graph, nullptr, 0, child.value().graph);
        d->cuGraphDestroy(child.value().graph);
        FOUNDRY_RETURN_IF_ERROR(cuda_check(r, "cuGraphAddChildGraphNode"));
        break;
      }
    }
  }
  // Edges go in one call per distinct edge data: given a batch with mixed data, the driver was
  // seen (CUDA 13.0, driver 580) to give every edge of the batch the first edge's type and ports.
  std::map<std::tuple<uint8_t, uint8_t, uint8_t>, std::pair<std::vector<CUgraphNode>, std::vector<CUgraphNode>>> batches;
  for (const Edge& e : model.edges) {
    if (e.from >= out->nodes.size() || e.to >= out->nodes.size()) return Error(FOUNDRY_ERR_FORMAT, "edge endpoint out of range");
    auto& batch = batches[std::make_tuple(e.type, e.from_port, e.to_port)];
    batch.first.push_back(out->nodes[e.from]);
    batch.second.push_back(out->nodes[e.to]);
  }
  for (auto& [key, ends] : batches) {
    CUgraphEdgeData ed;
    std::memset(&ed, 0, sizeof(ed));
    ed.type = std::get<0>(key), ed.from_port = std::get<1>(key), ed.to_port = std::get<2>(key);
    std::vector<CUgraphEdgeData> data(ends.first.size(), ed);
    FOUNDRY_RETURN_IF_ERROR(cuda_check(
        d->cuGraphAddDependencies(out->graph, ends.first.data(), ends.second.data(), data.data(), data.size()),
        "cuGraphAddDependencies"));
  }
  return Status::Ok();
}

Result<BuiltGraph> build_graph(const GraphModel& model, const std::vector<CUevent>& events, CUcontext ctx,
                               LiveCollectives* live) {
  const Driver* d = driver_if_open();
  BuiltGraph out;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphCreate(&out.graph, 0), "cuGraphCreate"));
  Status s = build_into(model, events, ctx, live, &out);
  if (!s.ok()) {
    d->cuGraphDestroy(out.graph);
    return s;
  }
  return out;
}

}  // namespace foundry
