#include "graph/reader.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "collective/collective_log.h"
#include "collective/nccl_api.h"
#include "common/log.h"
#include "common/strict.h"
#include "driver/driver.h"
#include "modules/cache_configs.h"
#include "modules/registry.h"
#include "region/region.h"
#include "region/word_class.h"

namespace foundry {
namespace {

constexpr int kMaxDepth = 8;
// Node launch attributes worth keeping (those valid for graph nodes).
constexpr CUlaunchAttributeID kNodeAttrs[] = {
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE,       CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, CU_LAUNCH_ATTRIBUTE_PRIORITY,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
    CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION,
};

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

const char* type_name(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return "kernel";
    case CU_GRAPH_NODE_TYPE_MEMCPY: return "memcpy";
    case CU_GRAPH_NODE_TYPE_MEMSET: return "memset";
    case CU_GRAPH_NODE_TYPE_HOST: return "host";
    case CU_GRAPH_NODE_TYPE_GRAPH: return "child graph";
    case CU_GRAPH_NODE_TYPE_EMPTY: return "empty";
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return "event wait";
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return "event record";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL: return "external semaphore signal";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT: return "external semaphore wait";
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: return "memory alloc";
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return "memory free";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: return "batch memory op";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return "conditional";
    default: return "unknown";
  }
}

const char* unsupported_reason(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_HOST: return "a host callback runs CPU code that cannot be persisted";
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      return "graph-owned allocations get driver-chosen addresses (capture with the caching allocator instead of cudaMallocAsync)";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return "conditional nodes are not supported yet";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT: return "external semaphores are process-local handles";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: return "batch memory operations are not supported yet";
    default: return "this node type is not supported";
  }
}

}  // namespace

uint32_t Reader::event_index(CUevent e) {
  auto it = events_.find(e);
  if (it != events_.end()) return it->second;
  uint32_t i = static_cast<uint32_t>(events_.size());
  events_[e] = i;
  return i;
}

Status Reader::audit(uint64_t value, const std::string& where_base, int64_t param_offset, ReadGraph* acc) {
  // SAVE audits millions of words: the cheap case first, before the region's lock.
  if (is_scalar_word(value)) return Status::Ok();
  bool is_param_word = param_offset >= 0;
  Block b;
  WordClass c = Region::instance().classify_word(value, &b);
  // Built only when needed.
  auto where = [&] { return is_param_word ? where_base + " parameter offset " + std::to_string(param_offset) : where_base; };
  switch (c) {
    case WordClass::kLive:
      acc->refs.push_back(RegionRef{b.offset, b.size, static_cast<uint32_t>(b.kind)});
      return Status::Ok();
    case WordClass::kNeverCovered:
      // A struct parameter packs 32-bit fields in pairs: (8192, 24576) reads as 0x600000002000, a
      // region address when the region starts at 0x600000000000. Space nothing ever occupied cannot
      // hold a pointer the kernel dereferences (it is unmapped), so such a word is a value.
      ++acc->lookalike_words;
      return Status::Ok();
    case WordClass::kFreed:
      // A parameter word may be a by-value struct's unused slot; a copy's or a collective's
      // address is dereferenced, so there it is a dangling pointer.
      if (is_param_word) return stale_word(value, where(), acc);
      return Error(FOUNDRY_ERR_AUDIT, where() + " points at " + hex(value) +
                                          ", inside the region in memory that was freed: LOAD could not reproduce it. "
                                          "Region history of that address: " + Region::instance().history(value));
    case WordClass::kScalar:
      return Status::Ok();
    case WordClass::kOutside:
      break;
  }
  return outside_word(value, where(), is_param_word, acc);
}

Status Reader::stale_word(uint64_t value, const std::string& where, ReadGraph* acc) {
  char halves[64];
  std::snprintf(halves, sizeof halves, " (as two 32-bit values: %u, %u)", static_cast<uint32_t>(value),
                static_cast<uint32_t>(value >> 32));
  std::string what = where + " points at " + hex(value) + halves + ", into region memory that was freed (" +
                     Region::instance().history(value) + ")";
  if (strict_mode()) {
    return Error(FOUNDRY_ERR_AUDIT,
                 what + ". Without FOUNDRY_STRICT such a word is kept verbatim: freed region memory is not mapped, so no "
                        "replay can dereference it, and it is taken for a leftover value (an unused slot of a by-value "
                        "parameter struct, as ATen's cat, stack and foreach kernels leave them). FOUNDRY_STRICT=1 refuses "
                        "it because that cannot be proven from the word alone; unset FOUNDRY_STRICT to save this graph");
  }
  if (acc->stale_words++ == 0) acc->first_stale_word = what;
  return Status::Ok();
}

Status Reader::outside_word(uint64_t value, const std::string& where, bool is_param_word, ReadGraph* acc) {
  const Driver* d = driver_if_open();
  unsigned int mem_type = 0;
  if (d->cuPointerGetAttribute(&mem_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, static_cast<CUdeviceptr>(value)) !=
      CUDA_SUCCESS) {
    return Status::Ok();  // not an address the driver knows: a scalar that looks like one
  }
  if (mem_type != CU_MEMORYTYPE_DEVICE && mem_type != CU_MEMORYTYPE_UNIFIED) return Status::Ok();
  ++acc->foreign_pointers;
  std::string msg = where + " points at device memory " + hex(value) +
                    " outside the allocation region: LOAD cannot reproduce its address (allocate it after "
                    "set_allocation_region)";
  if (strict_mode() || !is_param_word) return Error(FOUNDRY_ERR_AUDIT, msg);
  LOG_WARNING("%s", msg.c_str());
  return Status::Ok();
}

Result<const Reader::FunctionInfo*> Reader::function_info(CUfunction func, CUkernel kern) {
  void* key = func ? static_cast<void*>(func) : static_cast<void*>(kern);
  auto it = functions_.find(key);
  if (it != functions_.end()) return static_cast<const FunctionInfo*>(&it->second);
  const Driver* d = driver_if_open();
  FunctionInfo info;
  FOUNDRY_RETURN_IF_ERROR(Registry::instance().lookup(func, kern, &info.image_hash, &info.name));
  // Parameter layout from the driver, asked until it reports no further parameter.
  for (size_t i = 0;; ++i) {
    size_t off = 0, size = 0;
    CUresult r = func ? d->cuFuncGetParamInfo(func, i, &off, &size) : d->cuKernelGetParamInfo(kern, i, &off, &size);
    if (r != CUDA_SUCCESS) break;
    info.slots.push_back(ParamSlot{static_cast<uint32_t>(off), static_cast<uint32_t>(size)});
  }
  auto fattr = [&](CUfunction_attribute a, int32_t* out) {
    int v = 0;
    CUresult r = func ? d->cuFuncGetAttribute(&v, a, func) : d->cuKernelGetAttribute(&v, a, kern, 0);
    if (r == CUDA_SUCCESS) *out = v;
  };
  FunctionAttrs& f = info.attrs;
  fattr(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &f.max_dynamic_shared);
  fattr(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, &f.preferred_carveout);
  fattr(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, &f.required_cluster[0]);
  fattr(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT, &f.required_cluster[1]);
  fattr(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH, &f.required_cluster[2]);
  fattr(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, &f.non_portable_cluster);
  fattr(CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &f.cluster_scheduling);
  // No driver call reads a cache preference back: it is what the process was seen setting.
  CUdevice dev = 0;
  if (d->cuCtxGetDevice(&dev) != CUDA_SUCCESS) dev = 0;
  f.cache_config = CacheConfigLog::instance().get(func, kern, dev);
  auto inserted = functions_.emplace(key, std::move(info));
  return static_cast<const FunctionInfo*>(&inserted.first->second);
}

// NCCL's device kernels: ncclDevKernel_*, ncclSymkDevKernel_* (symmetric memory), older ncclKernel_*.
static bool is_nccl_kernel(const std::string& name) {
  size_t at = name.find("nccl");
  return at != std::string::npos && name.find("Kernel", at) != std::string::npos;
}

Status Reader::read_collective(CUgraphNode node, const std::string& where, CollectiveNode* c, ReadGraph* acc) {
  const Driver* d = driver_if_open();
  CUDA_KERNEL_NODE_PARAMS p{};
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphKernelNodeGetParams(node, &p), "cuGraphKernelNodeGetParams"));
  const char* name = nullptr;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuFuncGetName(&name, p.func), "cuFuncGetName"));
  c->name = name ? name : "";
  std::string at = where + " (NCCL " + nccl::op_name(c->calls.front().op) + ", kernel " + c->name + ")";
  if (!is_nccl_kernel(c->name)) {
    return Error(FOUNDRY_ERR_UNSUPPORTED, at + ": the NCCL launch added a kernel that is not NCCL's, which LOAD could "
                                               "not make again; this NCCL version is not supported inside graphs "
                                               "(start without Foundry, or capture this collective outside the graph)");
  }
  // NCCL's own parameters (its communicator, channels, work) are process-local: LOAD gets them
  // from the live NCCL. The buffers the calls name must be reproducible like any other pointer.
  for (const CollectiveCall& call : c->calls) {
    if (call.comm == kUnknownComm) {
      return Error(FOUNDRY_ERR_UNSUPPORTED, at + ": its communicator was created before Foundry could see it (is "
                                                 "libfoundry.so preloaded before NCCL is loaded?)");
    }
    if (call.send != 0) FOUNDRY_RETURN_IF_ERROR(audit(call.send, at + " send buffer", -1, acc));
    if (call.recv != 0) FOUNDRY_RETURN_IF_ERROR(audit(call.recv, at + " receive buffer", -1, acc));
  }
  return Status::Ok();
}

Status Reader::read_kernel(CUgraphNode node, const std::string& where, KernelNode* k, ReadGraph* acc) {
  const Driver* d = driver_if_open();
  CUDA_KERNEL_NODE_PARAMS p{};
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphKernelNodeGetParams(node, &p), "cuGraphKernelNodeGetParams"));
  auto info = function_info(p.func, p.kern);
  if (!info.ok()) return info.status();
  k->image_hash = info.value()->image_hash;
  k->name = info.value()->name;
  k->slots = info.value()->slots;
  k->func = info.value()->attrs;
  std::string at = where + " (kernel " + k->name + ")";
  if (is_nccl_kernel(k->name)) {
    return Error(FOUNDRY_ERR_UNSUPPORTED, at + ": an NCCL kernel whose launch Foundry did not see (only ncclAllReduce, "
                                               "ncclAllGather, ncclReduceScatter, ncclBroadcast and ncclReduce are "
                                               "recorded, and only with libfoundry.so preloaded)");
  }
  k->grid[0] = p.gridDimX, k->grid[1] = p.gridDimY, k->grid[2] = p.gridDimZ;
  k->block[0] = p.blockDimX, k->block[1] = p.blockDimY, k->block[2] = p.blockDimZ;
  k->shared_mem = p.sharedMemBytes;

  size_t total = 0;
  for (const ParamSlot& s : k->slots) total = std::max<size_t>(total, s.offset + s.size);
  k->params.assign(total, 0);
  if (p.kernelParams != nullptr) {
    for (size_t i = 0; i < k->slots.size(); ++i) std::memcpy(&k->params[k->slots[i].offset], p.kernelParams[i], k->slots[i].size);
  } else if (p.extra != nullptr) {
    const void* buf = nullptr;
    size_t buf_size = 0;
    for (size_t i = 0; p.extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = p.extra[i + 1];
      if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) buf_size = *static_cast<size_t*>(p.extra[i + 1]);
    }
    if (buf == nullptr || buf_size < total) return Error(FOUNDRY_ERR_UNSUPPORTED, at + ": unreadable `extra` argument buffer");
    std::memcpy(k->params.data(), buf, total);
  } else if (total > 0) {
    return Error(FOUNDRY_ERR_UNSUPPORTED, at + ": kernel has parameters but the node carries none");
  }
  // Audit every 8-byte-aligned word of every parameter large enough to hold a pointer.
  for (const ParamSlot& s : k->slots) {
    for (uint32_t o = (s.offset + 7) / 8 * 8; o + 8 <= s.offset + s.size; o += 8) {
      uint64_t word;
      std::memcpy(&word, &k->params[o], 8);
      FOUNDRY_RETURN_IF_ERROR(audit(word, at, o, acc));
    }
  }
  for (CUlaunchAttributeID id : kNodeAttrs) {
    CUlaunchAttributeValue v;
    std::memset(&v, 0, sizeof(v));
    if (d->cuGraphKernelNodeGetAttribute(node, id, &v) != CUDA_SUCCESS) continue;
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v);
    if (std::all_of(bytes, bytes + sizeof(v), [](uint8_t b) { return b == 0; })) continue;
    k->attrs.push_back(LaunchAttr{static_cast<uint32_t>(id), std::vector<uint8_t>(bytes, bytes + sizeof(v))});
  }
  k->func.max_dynamic_shared = std::max<int32_t>(k->func.max_dynamic_shared, static_cast<int32_t>(k->shared_mem));
  return Status::Ok();
}

Status Reader::read_into(CUgraph graph, const std::string& label, int depth, GraphModel* out, ReadGraph* acc) {
  if (depth > kMaxDepth) return Error(FOUNDRY_ERR_UNSUPPORTED, label + ": child graphs nested deeper than " + std::to_string(kMaxDepth));
  const Driver* d = driver_if_open();
  size_t n = 0;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphGetNodes(graph, nullptr, &n), "cuGraphGetNodes"));
  std::vector<CUgraphNode> nodes(n);
  if (n) FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphGetNodes(graph, nodes.data(), &n), "cuGraphGetNodes"));
  std::map<CUgraphNode, uint32_t> index;
  for (size_t i = 0; i < n; ++i) index[nodes[i]] = static_cast<uint32_t>(i);
  out->nodes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::string where = label + " node " + std::to_string(i);
    CUgraphNodeType t;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphNodeGetType(nodes[i], &t), "cuGraphNodeGetType"));
    Node& node = out->nodes[i];
    switch (t) {
      case CU_GRAPH_NODE_TYPE_KERNEL:
        if (CollectiveLog::instance().find(graph, nodes[i], &node.collective)) {
          node.kind = NodeKind::kCollective;
          FOUNDRY_RETURN_IF_ERROR(read_collective(nodes[i], where, &node.collective, acc));
          break;
        }
        node.kind = NodeKind::kKernel;
        FOUNDRY_RETURN_IF_ERROR(read_kernel(nodes[i], where, &node.kernel, acc));
        break;
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        node.kind = NodeKind::kMemset;
        CUDA_MEMSET_NODE_PARAMS p{};
        FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphMemsetNodeGetParams(nodes[i], &p), "cuGraphMemsetNodeGetParams"));
        node.memset = MemsetNode{p.dst, p.pitch, p.value, p.elementSize, p.width, p.height};
        FOUNDRY_RETURN_IF_ERROR(audit(p.dst, where + " (memset destination)", -1, acc));
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMCPY: {
        node.kind = NodeKind::kMemcpy;
        CUDA_MEMCPY3D p{};
        FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphMemcpyNodeGetParams(nodes[i], &p), "cuGraphMemcpyNodeGetParams"));
        auto device_side = [](CUmemorytype m) { return m == CU_MEMORYTYPE_DEVICE || m == CU_MEMORYTYPE_UNIFIED; };
        if (!device_side(p.srcMemoryType) || !device_side(p.dstMemoryType)) {
          return Error(FOUNDRY_ERR_UNSUPPORTED, where + " (memcpy): only device-to-device copies can be persisted; this one "
                                                        "involves host memory or an array");
        }
        MemcpyNode& m = node.memcpy;
        m.src = p.srcDevice, m.dst = p.dstDevice;
        m.src_x = p.srcXInBytes, m.src_y = p.srcY, m.src_z = p.srcZ, m.src_pitch = p.srcPitch, m.src_height = p.srcHeight;
        m.dst_x = p.dstXInBytes, m.dst_y = p.dstY, m.dst_z = p.dstZ, m.dst_pitch = p.dstPitch, m.dst_height = p.dstHeight;
        m.width = p.WidthInBytes, m.height = p.Height, m.depth = p.Depth;
        FOUNDRY_RETURN_IF_ERROR(audit(p.srcDevice, where + " (memcpy source)", -1, acc));
        FOUNDRY_RETURN_IF_ERROR(audit(p.dstDevice, where + " (memcpy destination)", -1, acc));
        break;
      }
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
        CUevent e = nullptr;
        bool record = t == CU_GRAPH_NODE_TYPE_EVENT_RECORD;
        FOUNDRY_RETURN_IF_ERROR(cuda_check(record ? d->cuGraphEventRecordNodeGetEvent(nodes[i], &e)
                                                  : d->cuGraphEventWaitNodeGetEvent(nodes[i], &e),
                                           "cuGraphEvent*NodeGetEvent"));
        node.kind = record ? NodeKind::kEventRecord : NodeKind::kEventWait;
        node.event = event_index(e);
        break;
      }
      case CU_GRAPH_NODE_TYPE_EMPTY:
        node.kind = NodeKind::kEmpty;
        break;
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        CUgraph child = nullptr;
        FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphChildGraphNodeGetGraph(nodes[i], &child), "cuGraphChildGraphNodeGetGraph"));
        node.kind = NodeKind::kChildGraph;
        node.child = static_cast<uint32_t>(out->children.size());
        out->children.emplace_back();
        FOUNDRY_RETURN_IF_ERROR(read_into(child, where + " child", depth + 1, &out->children.back(), acc));
        break;
      }
      default:
        return Error(FOUNDRY_ERR_UNSUPPORTED, where + " is a " + type_name(t) + " node: " + unsupported_reason(t));
    }
  }
  size_t ne = 0;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &ne), "cuGraphGetEdges"));
  std::vector<CUgraphNode> from(ne), to(ne);
  std::vector<CUgraphEdgeData> data(ne);
  if (ne) FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphGetEdges(graph, from.data(), to.data(), data.data(), &ne), "cuGraphGetEdges"));
  for (size_t i = 0; i < ne; ++i) {
    out->edges.push_back(Edge{index.at(from[i]), index.at(to[i]), data[i].from_port, data[i].to_port, data[i].type});
  }
  std::sort(out->edges.begin(), out->edges.end(), [](const Edge& a, const Edge& b) {
    return std::tie(a.from, a.to, a.from_port, a.to_port, a.type) < std::tie(b.from, b.to, b.from_port, b.to_port, b.type);
  });
  return Status::Ok();
}

Result<ReadGraph> Reader::read(CUgraph graph, const std::string& label) {
  auto drv = driver();
  if (!drv.ok()) return drv.status();
  FOUNDRY_RETURN_IF_ERROR(ensure_context());
  ReadGraph out;
  FOUNDRY_RETURN_IF_ERROR(read_into(graph, label, 0, &out.model, &out));
  std::sort(out.refs.begin(), out.refs.end(), [](const RegionRef& a, const RegionRef& b) { return a.offset < b.offset; });
  out.refs.erase(std::unique(out.refs.begin(), out.refs.end(),
                             [](const RegionRef& a, const RegionRef& b) { return a.offset == b.offset; }),
                 out.refs.end());
  return out;
}

}  // namespace foundry
