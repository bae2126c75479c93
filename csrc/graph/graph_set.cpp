#include "graph/graph_set.h"

#include <algorithm>
#include <cinttypes>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string_view>

#include "collective/serial_events.h"
#include "common/log.h"
#include "driver/driver.h"
#include "graph/builder.h"
#include "graph/exec_flags.h"
#include "modules/registry.h"
#include "region/region.h"
#include "region/va_space.h"

namespace foundry {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<std::unique_ptr<GraphSet>> GraphSet::open(const std::string& payload_path, DeltaRead deltas) {
  auto t0 = std::chrono::steady_clock::now();
  auto container = Container::read_file(payload_path);
  if (!container.ok()) return container.status();
  // Pending deltas are read again from the file (held open) and checked at first use.
  auto payload = parse_payload(container.value(), payload_path, deltas);
  if (!payload.ok()) return payload.status();
  std::unique_ptr<GraphSet> set(new GraphSet());
  set->path_ = payload_path;
  set->payload_ = std::move(payload.value());
  set->times_.read_s = seconds_since(t0);
  FOUNDRY_RETURN_IF_ERROR(set->prepare());
  return set;
}

Status GraphSet::prepare() {
  auto drv = driver();
  if (!drv.ok()) return drv.status();
  const Driver* d = drv.value();
  FOUNDRY_RETURN_IF_ERROR(ensure_context());
  d->cuCtxGetCurrent(&ctx_);

  // Memory first: every block any graph references, at its recorded address.
  auto t0 = std::chrono::steady_clock::now();
  RegionInfo region = Region::instance().info();
  bool needs_region = std::any_of(payload_.members.begin(), payload_.members.end(), [](const PayloadMember& m) { return !m.refs.empty(); });
  if (needs_region) {
    if (!region.set) return Error(FOUNDRY_ERR_STATE, "the graphs reference region memory; call set_allocation_region first");
    if (region.base != payload_.region_base) {
      return Error(FOUNDRY_ERR_MISMATCH, "the region is at a different base than at SAVE (graphs were saved with base " +
                                             std::to_string(payload_.region_base) + ")");
    }
  }
  std::map<uint64_t, RegionRef> blocks;
  for (const PayloadMember& m : payload_.members) for (const RegionRef& r : m.refs) blocks[r.offset] = r;
  for (const auto& [offset, ref] : blocks) {
    if (ref.kind == static_cast<uint32_t>(BlockKind::kReserve)) continue;  // the application maps those itself
    bool mapped = false;
    FOUNDRY_RETURN_IF_ERROR(Region::instance().claim(ref.offset, ref.size, &mapped));
    (mapped ? times_.mapped_blocks : times_.existing_blocks)++;
  }
  times_.claim_s = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  // parse_payload checked every node and event index read so far (ensure_delta checks the rest,
  // as it reads them) and every kernel is known: writing a delta read at open can only fail in
  // the driver.
  FOUNDRY_RETURN_IF_ERROR(check_kernels_exist());
  for (uint32_t i = 0; i < payload_.event_count; ++i) {
    CUevent e;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    events_.push_back(e);
    own_events_.push_back(true);
  }
  for (size_t t = 0; t < payload_.templates.size(); ++t) templates_.push_back(std::make_unique<Template>());
  for (size_t i = 0; i < payload_.members.size(); ++i) members_.push_back(std::make_unique<Member>());
  FOUNDRY_RETURN_IF_ERROR(prepare_collectives());
  FOUNDRY_RETURN_IF_ERROR(bind_nccl_events());
  times_.build_s = seconds_since(t0);
  return Status::Ok();
}

Status GraphSet::prepare_collectives() {
  std::vector<const CollectiveNode*> found;
  for_each_node(payload_, [&found](const Node& n) {
    if (n.kind == NodeKind::kCollective) found.push_back(&n.collective);
  });
  if (found.empty()) return Status::Ok();
  // Every launch is made now, on this thread, in the archive's order: NCCL calls on one
  // communicator must not race, and instantiation threads then only look the results up.
  collectives_ = std::make_unique<LiveCollectives>();
  for (const CollectiveNode* c : found) {
    auto k = collectives_->kernel(*c);
    if (!k.ok()) return k.status();
  }
  LOG_INFO("%zu NCCL launches made again by the live NCCL for %zu collective nodes", collectives_->launches(), found.size());
  return Status::Ok();
}

Status GraphSet::bind_nccl_events() {
  if (!collectives_) return Status::Ok();
  const Driver* d = driver_if_open();
  uint64_t ambiguous = 0;
  for (const auto& [index, uses] : nccl_serial_events(payload_)) {
    // One live event for every launch the archived event bracketed, or none: an event that was
    // shared at SAVE and would be split now keeps this set's own.
    CUevent live = nullptr;
    bool one = true;
    for (const CollectiveNode* c : uses) {
      auto e = collectives_->serial_event(*c);
      if (!e.ok()) return e.status();
      one = one && e.value() != nullptr && (live == nullptr || live == e.value());
      live = e.value();
    }
    if (!one) {
      ++ambiguous;
      continue;
    }
    d->cuEventDestroy(events_[index]);
    events_[index] = live;
    own_events_[index] = false;
    ++times_.nccl_events;
  }
  if (times_.nccl_events) LOG_INFO("%" PRIu64 " archived events bound to the live NCCL's serial event", times_.nccl_events);
  if (ambiguous) {
    LOG_WARNING("%" PRIu64 " archived events around NCCL launches kept as the set's own: NCCL now brackets those "
             "launches with no event or several", ambiguous);
  }
  return Status::Ok();
}

Status GraphSet::apply_collectives(size_t i, const std::vector<CUgraphNode>& nodes) {
  if (!collectives_) return Status::Ok();
  const PayloadMember& m = payload_.members[i];
  const GraphModel& t = payload_.templates[m.template_index];
  std::map<uint32_t, const CollectiveNode*> mine;
  for (uint32_t j = 0; j < t.nodes.size(); ++j)
    if (t.nodes[j].kind == NodeKind::kCollective) mine[j] = &t.nodes[j].collective;
  for (const NodeDelta& d : m.delta)
    if (d.value.kind == NodeKind::kCollective) mine[d.node] = &d.value.collective;
  for (const auto& [j, c] : mine) FOUNDRY_RETURN_IF_ERROR(collectives_->apply(*c, nodes.at(j)));
  return Status::Ok();
}

Status GraphSet::ensure_delta(size_t i) {
  if (!payload_.members[i].delta_pending) return Status::Ok();
  auto t0 = std::chrono::steady_clock::now();
  Status s = read_pending_delta(&payload_, i, path_);
  read_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

namespace {

bool same_kernel(const KernelNode& a, const KernelNode& b) { return a.image_hash == b.image_hash && a.name == b.name; }

int32_t dynamic_shared_need(const KernelNode& k) { return std::max(k.func.max_dynamic_shared, static_cast<int32_t>(k.shared_mem)); }

// The delta's kernel nodes that ask for more than their template node: another kernel, or more
// dynamic shared memory (a template's own kernels are taken care of when it is built).
std::vector<const KernelNode*> beyond_template(const GraphModel& t, const std::vector<NodeDelta>& delta) {
  std::vector<const KernelNode*> out;
  for (const NodeDelta& d : delta) {
    if (d.value.kind != NodeKind::kKernel) continue;
    const KernelNode& k = d.value.kernel;
    const KernelNode& base = t.nodes[d.node].kernel;
    if (!same_kernel(k, base) || dynamic_shared_need(k) > dynamic_shared_need(base)) out.push_back(&k);
  }
  return out;
}

// g's kernel nodes, its child graphs' included.
std::vector<const KernelNode*> kernel_nodes(const GraphModel& g) {
  std::vector<const KernelNode*> out;
  std::function<void(const GraphModel&)> walk = [&](const GraphModel& m) {
    for (const Node& n : m.nodes) if (n.kind == NodeKind::kKernel) out.push_back(&n.kernel);
    for (const GraphModel& c : m.children) walk(c);
  };
  walk(g);
  return out;
}

}  // namespace

Status GraphSet::check_kernels_exist() const {
  std::set<std::pair<uint64_t, std::string_view>> kernels;
  for (const GraphModel& t : payload_.templates)
    for (const KernelNode* k : kernel_nodes(t)) kernels.emplace(k->image_hash, k->name);
  for (const PayloadMember& m : payload_.members)  // deltas mostly keep their template node's kernel
    for (const KernelNode* k : beyond_template(payload_.templates[m.template_index], m.delta))
      kernels.emplace(k->image_hash, k->name);
  for (const auto& [hash, name] : kernels) FOUNDRY_RETURN_IF_ERROR(Registry::instance().check_entry(hash, std::string(name)));
  return Status::Ok();
}

Status GraphSet::require_function_attrs(const std::vector<const KernelNode*>& nodes) {
  // One entry per kernel (a graph launches each many times), then the lock once.
  std::map<std::pair<uint64_t, std::string_view>, std::pair<int32_t, const KernelNode*>> needs;
  for (const KernelNode* k : nodes) {
    int32_t need = dynamic_shared_need(*k);
    auto [it, fresh] = needs.try_emplace({k->image_hash, k->name}, need, k);
    if (!fresh) it->second.first = std::max(it->second.first, need);
  }
  std::lock_guard<std::mutex> lock(attrs_mu_);
  for (const auto& [key, need] : needs) {
    auto [it, fresh] = attrs_.try_emplace({key.first, std::string(key.second)}, need.first);
    if (!fresh && it->second >= need.first) continue;
    Status s = apply_function_attrs(*need.second, need.first, fresh);
    if (!s.ok()) {
      if (fresh) attrs_.erase(it);
      return s;
    }
    it->second = need.first;
  }
  return Status::Ok();
}

Status GraphSet::require_function_attrs(const GraphModel& g) { return require_function_attrs(kernel_nodes(g)); }

Status GraphSet::prepare_member(size_t i) {
  FOUNDRY_RETURN_IF_ERROR(ensure_delta(i));
  return require_function_attrs(i);
}

Status GraphSet::require_function_attrs(size_t i) {
  const PayloadMember& m = payload_.members[i];
  return require_function_attrs(beyond_template(payload_.templates[m.template_index], m.delta));
}

Status GraphSet::ensure_built(uint32_t t) {
  Template& tmpl = *templates_[t];
  if (tmpl.built) return Status::Ok();
  auto t0 = std::chrono::steady_clock::now();
  FOUNDRY_RETURN_IF_ERROR(require_function_attrs(payload_.templates[t]));
  auto built = build_graph(payload_.templates[t], events_, ctx_, collectives_.get());
  if (!built.ok()) return built.status();
  tmpl.work.graph = built.value().graph;
  tmpl.work.nodes = std::move(built.value().nodes);
  tmpl.work.holds = -1;
  tmpl.built = true;
  build_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

LoadTimes GraphSet::times() const {
  LoadTimes t = times_;
  t.build_s += static_cast<double>(build_ns_.load()) * 1e-9;
  t.update_s = static_cast<double>(update_ns_.load()) * 1e-9;
  t.read_s += static_cast<double>(read_ns_.load()) * 1e-9;
  return t;
}

Result<CUgraph> GraphSet::template_graph(size_t i) {
  if (i >= members_.size()) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "graph index out of range");
  uint32_t t = payload_.members[i].template_index;
  std::lock_guard<std::mutex> mlock(members_[i]->mu);
  FOUNDRY_RETURN_IF_ERROR(prepare_member(i));
  std::lock_guard<std::mutex> lock(templates_[t]->mu);
  FOUNDRY_RETURN_IF_ERROR(ensure_built(t));
  FOUNDRY_RETURN_IF_ERROR(switch_to(i, &templates_[t]->work));
  return templates_[t]->work.graph;
}

Status GraphSet::set_node(const Node& n, CUgraphNode node, size_t index, size_t member) {
  const Driver* d = driver_if_open();
  CUresult r = CUDA_SUCCESS;
  switch (n.kind) {
    case NodeKind::kKernel: {
      CUDA_KERNEL_NODE_PARAMS p;
      std::vector<void*> args;
      FOUNDRY_RETURN_IF_ERROR(kernel_params(n.kernel, &p, &args));
      r = d->cuGraphKernelNodeSetParams(node, &p);
      break;
    }
    case NodeKind::kMemset: {
      CUDA_MEMSET_NODE_PARAMS p;
      memset_params(n.memset, &p);
      r = d->cuGraphMemsetNodeSetParams(node, &p);
      break;
    }
    case NodeKind::kMemcpy: {
      CUDA_MEMCPY3D p;
      memcpy_params(n.memcpy, &p);
      r = d->cuGraphMemcpyNodeSetParams(node, &p);
      break;
    }
    case NodeKind::kEventRecord:
      r = d->cuGraphEventRecordNodeSetEvent(node, events_[n.event]);  // checked by read_payload
      break;
    case NodeKind::kEventWait:
      r = d->cuGraphEventWaitNodeSetEvent(node, events_[n.event]);
      break;
    case NodeKind::kEmpty:
    case NodeKind::kChildGraph:
    case NodeKind::kCollective:  // NCCL's nodes are set by apply_collectives
      break;
  }
  if (r == CUDA_SUCCESS) return Status::Ok();
  return cuda_error(r, ("writing node " + std::to_string(index) + " of graph " + std::to_string(member) + " (" +
                        payload_.members[member].name + ") into its template")
                           .c_str());
}

Status GraphSet::reset_to_template(size_t i, Working* w) {
  const GraphModel& g = payload_.templates[payload_.members[i].template_index];
  for (size_t j = 0; j < g.nodes.size(); ++j) FOUNDRY_RETURN_IF_ERROR(set_node(g.nodes[j], w->nodes[j], j, i));
  w->holds = -1;
  return Status::Ok();
}

Status GraphSet::switch_to(size_t i, Working* w) {
  if (w->holds == static_cast<int64_t>(i)) return Status::Ok();
  auto t0 = std::chrono::steady_clock::now();
  const PayloadMember& m = payload_.members[i];
  const GraphModel& t = payload_.templates[m.template_index];
  // A switch that failed part-way left values of two members: start again from the template's.
  if (w->holds == Working::kUnknown) FOUNDRY_RETURN_IF_ERROR(reset_to_template(i, w));
  std::vector<uint8_t> mine(w->nodes.size(), 0);
  for (const NodeDelta& d : m.delta) mine[d.node] = 1;  // node indices were checked when the payload was read
  int64_t held = w->holds;
  w->holds = Working::kUnknown;  // until every write below succeeded
  if (held >= 0) {
    for (const NodeDelta& d : payload_.members[held].delta)
      if (!mine[d.node]) FOUNDRY_RETURN_IF_ERROR(set_node(t.nodes[d.node], w->nodes[d.node], d.node, i));
  }
  for (const NodeDelta& d : m.delta) FOUNDRY_RETURN_IF_ERROR(set_node(d.value, w->nodes[d.node], d.node, i));
  // NCCL's nodes are set on the graph too, so a member may use another NCCL kernel than its template's.
  FOUNDRY_RETURN_IF_ERROR(apply_collectives(i, w->nodes));
  w->holds = static_cast<int64_t>(i);
  update_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

Status GraphSet::instantiate_from(size_t i, Working* w) {
  FOUNDRY_RETURN_IF_ERROR(switch_to(i, w));
  CUgraphExec exec = nullptr;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(driver_if_open()->cuGraphInstantiateWithFlags(&exec, w->graph, exec_instantiate_flags()),
                                     ("cuGraphInstantiate of graph " + std::to_string(i) + " (" + payload_.members[i].name + ")").c_str()));
  members_[i]->exec.store(exec, std::memory_order_release);
  return Status::Ok();
}

Result<uint64_t> GraphSet::exec_flags(size_t i) const {
  if (i >= members_.size()) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "graph index out of range");
  CUgraphExec exec = members_[i]->exec.load(std::memory_order_acquire);
  if (exec == nullptr) return Error(FOUNDRY_ERR_STATE, "graph " + std::to_string(i) + " is not instantiated yet");
  cuuint64_t flags = 0;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(driver_if_open()->cuGraphExecGetFlags(exec, &flags), "cuGraphExecGetFlags"));
  return static_cast<uint64_t>(flags);
}

Status GraphSet::instantiate(size_t i) {
  if (i >= members_.size()) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "graph index out of range");
  Member& m = *members_[i];
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.exec.load(std::memory_order_relaxed) != nullptr) return Status::Ok();
  FOUNDRY_RETURN_IF_ERROR(prepare_member(i));
  uint32_t index = payload_.members[i].template_index;
  Template& t = *templates_[index];
  std::lock_guard<std::mutex> tlock(t.mu);
  FOUNDRY_RETURN_IF_ERROR(ensure_built(index));
  return instantiate_from(i, &t.work);
}

Status GraphSet::clone_template(uint32_t t, Working* clone) {
  const Driver* d = driver_if_open();
  Template& tmpl = *templates_[t];
  std::lock_guard<std::mutex> lock(tmpl.mu);
  FOUNDRY_RETURN_IF_ERROR(ensure_built(t));
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphClone(&clone->graph, tmpl.work.graph), "cuGraphClone"));
  clone->holds = tmpl.work.holds;
  clone->nodes.resize(tmpl.work.nodes.size());
  for (size_t i = 0; i < tmpl.work.nodes.size(); ++i) {
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuGraphNodeFindInClone(&clone->nodes[i], tmpl.work.nodes[i], clone->graph),
                                       "cuGraphNodeFindInClone"));
  }
  return Status::Ok();
}

Status GraphSet::instantiate_all(int threads) {
  auto t0 = std::chrono::steady_clock::now();
  if (threads <= 1) {
    for (size_t i = 0; i < members_.size(); ++i) FOUNDRY_RETURN_IF_ERROR(instantiate(i));
    times_.instantiate_s = seconds_since(t0);
    return Status::Ok();
  }
  // Each worker instantiates from its own clones, so no CUgraph is used by two threads at once.
  std::atomic<size_t> next{0};
  std::vector<Status> results(threads);
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([this, w, &next, &results] {
      const Driver* d = driver_if_open();
      d->cuCtxSetCurrent(ctx_);
      std::vector<Working> clones(templates_.size());
      auto run = [&]() -> Status {
        for (size_t i; (i = next.fetch_add(1)) < members_.size();) {
          uint32_t t = payload_.members[i].template_index;
          if (clones[t].graph == nullptr) FOUNDRY_RETURN_IF_ERROR(clone_template(t, &clones[t]));
          Member& m = *members_[i];
          std::lock_guard<std::mutex> lock(m.mu);
          if (m.exec.load(std::memory_order_relaxed) != nullptr) continue;
          FOUNDRY_RETURN_IF_ERROR(prepare_member(i));
          FOUNDRY_RETURN_IF_ERROR(instantiate_from(i, &clones[t]));
        }
        return Status::Ok();
      };
      results[w] = run();
      for (const Working& c : clones) if (c.graph) d->cuGraphDestroy(c.graph);
    });
  }
  for (std::thread& t : pool) t.join();
  times_.instantiate_s = seconds_since(t0);
  for (const Status& s : results) FOUNDRY_RETURN_IF_ERROR(s);
  return Status::Ok();
}

void GraphSet::start_background() {
  if (background_.joinable()) return;
  background_ = std::thread([this] {
    driver_if_open()->cuCtxSetCurrent(ctx_);
    for (size_t i = 0; i < members_.size() && !stop_.load(); ++i) {
      Status s = instantiate(i);
      if (!s.ok()) LOG_WARNING("background instantiation of graph %zu failed: %s", i, s.message().c_str());
    }
  });
}

Status GraphSet::launch(size_t i, CUstream stream) {
  if (i >= members_.size()) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "graph index out of range");
  CUgraphExec exec = members_[i]->exec.load(std::memory_order_acquire);
  if (exec == nullptr) {
    FOUNDRY_RETURN_IF_ERROR(instantiate(i));
    exec = members_[i]->exec.load(std::memory_order_acquire);
  }
  return cuda_check(driver_if_open()->cuGraphLaunch(exec, stream), "cuGraphLaunch");
}

GraphSet::~GraphSet() {
  stop_.store(true);
  if (background_.joinable()) background_.join();
  const Driver* d = driver_if_open();
  if (d == nullptr) return;
  for (auto& m : members_) if (CUgraphExec e = m->exec.load()) d->cuGraphExecDestroy(e);
  for (auto& t : templates_) if (t->work.graph) d->cuGraphDestroy(t->work.graph);
  for (size_t i = 0; i < events_.size(); ++i)
    if (own_events_[i]) d->cuEventDestroy(events_[i]);
}

}  // namespace foundry
