#include "graph/exec_warmup.h"

#include <algorithm>
#include <chrono>

#include "archive/container.h"
#include "driver/driver.h"
#include "graph/exec_flags.h"
#include "graph/payload.h"

namespace foundry {
namespace {

// A kernel that does nothing, with a 256-byte parameter block (decode kernels' blocks are tens to
// hundreds of bytes). PTX for sm_75, which the driver compiles for any newer GPU.
constexpr char kNoopPtx[] =
    ".version 7.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry foundry_exec_warmup_noop(.param .align 8 .b8 p[256]) { ret; }\n";
constexpr size_t kNoopParamBytes = 256;

// Driver objects of one warm-up, released in reverse order whatever happens.
class StandIns {
 public:
  explicit StandIns(const Driver* d) : d_(d) {}
  StandIns(const StandIns&) = delete;
  StandIns& operator=(const StandIns&) = delete;
  ~StandIns() {
    for (CUgraphExec e : execs_) d_->cuGraphExecDestroy(e);
    if (graph_ != nullptr) d_->cuGraphDestroy(graph_);
    if (module_ != nullptr) d_->cuModuleUnload(module_);
  }

  Status open() {
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d_->cuModuleLoadData(&module_, kNoopPtx), "cuModuleLoadData (no-op kernel)"));
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d_->cuModuleGetFunction(&func_, module_, "foundry_exec_warmup_noop"),
                                       "cuModuleGetFunction (no-op kernel)"));
    return cuda_check(d_->cuGraphCreate(&graph_, 0), "cuGraphCreate");
  }

  // Appends kernel nodes to the chain until it has `nodes`.
  Status grow_to(uint64_t nodes) {
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = func_;
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 32, p.blockDimY = p.blockDimZ = 1;
    void* args[] = {params_};
    p.kernelParams = args;
    while (length_ < nodes) {
      CUgraphNode node = nullptr;
      size_t deps = last_ != nullptr ? 1 : 0;
      FOUNDRY_RETURN_IF_ERROR(cuda_check(d_->cuGraphAddKernelNode(&node, graph_, &last_, deps, &p), "cuGraphAddKernelNode"));
      last_ = node;
      ++length_;
    }
    return Status::Ok();
  }

  Status instantiate() {
    CUgraphExec exec = nullptr;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d_->cuGraphInstantiateWithFlags(&exec, graph_, exec_instantiate_flags()), "cuGraphInstantiate (stand-in)"));
    execs_.push_back(exec);
    return Status::Ok();
  }

 private:
  const Driver* d_;
  CUmodule module_ = nullptr;
  CUfunction func_ = nullptr;
  CUgraph graph_ = nullptr;
  CUgraphNode last_ = nullptr;
  uint64_t length_ = 0;
  alignas(8) unsigned char params_[kNoopParamBytes] = {};
  std::vector<CUgraphExec> execs_;
};

}  // namespace

uint64_t flattened_nodes(const GraphModel& g) {
  uint64_t n = 0;
  for (const Node& node : g.nodes) {
    n += node.kind == NodeKind::kChildGraph && node.child < g.children.size() ? flattened_nodes(g.children[node.child]) : 1;
  }
  return n;
}

Result<std::vector<uint64_t>> payload_graph_sizes(const std::string& payload_path) {
  auto container = Container::read_file(payload_path);
  if (!container.ok()) return container.status();
  auto payload = parse_payload(container.value(), payload_path, DeltaRead::kLater);
  if (!payload.ok()) return payload.status();
  std::vector<uint64_t> per_template;
  for (const GraphModel& t : payload.value().templates) per_template.push_back(flattened_nodes(t));
  std::vector<uint64_t> sizes;
  for (const PayloadMember& m : payload.value().members) sizes.push_back(per_template.at(m.template_index));
  return sizes;
}

Result<ExecWarmup> warm_exec_memory(std::vector<uint64_t> node_counts, const int* stop) {
  auto t0 = std::chrono::steady_clock::now();
  auto drv = driver();
  if (!drv.ok()) return drv.status();
  FOUNDRY_RETURN_IF_ERROR(ensure_context());
  ExecWarmup out;
  // One chain, grown from the smallest size to the largest and instantiated at each: the driver
  // snapshots a graph when it instantiates it, so later nodes do not reach earlier execs.
  std::sort(node_counts.begin(), node_counts.end());
  out.graphs = static_cast<uint64_t>(std::count_if(node_counts.begin(), node_counts.end(), [](uint64_t n) { return n > 0; }));
  {
    StandIns stand_ins(drv.value());
    FOUNDRY_RETURN_IF_ERROR(stand_ins.open());
    for (uint64_t n : node_counts) {
      if (n == 0) continue;
      if (stop != nullptr && __atomic_load_n(stop, __ATOMIC_ACQUIRE) != 0) break;
      FOUNDRY_RETURN_IF_ERROR(stand_ins.grow_to(n));
      FOUNDRY_RETURN_IF_ERROR(stand_ins.instantiate());
      ++out.execs;
      out.nodes += n;
    }
  }  // every exec destroyed here: the driver keeps their memory for the restore's
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace foundry
