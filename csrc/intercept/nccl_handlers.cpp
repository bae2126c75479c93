// NCCL entry points. Communicator creation is recorded in order (the ordinal names a
// communicator across processes); a collective launched into a stream that is being captured is
// recorded with the kernel nodes it added, so that SAVE can store the call instead of NCCL's
// process-local kernel parameters, and LOAD can make it again. Everything else is NCCL's.
#include <cuda.h>

#include <algorithm>
#include <unordered_set>
#include <vector>

#include "collective/collective_log.h"
#include "collective/nccl_api.h"
#include "driver/driver.h"
#include "intercept/handlers.h"
#include "intercept/table.h"

using foundry::CollectiveCall;
using foundry::CollectiveLog;
namespace nccl = foundry::nccl;
using nccl::CollectiveOp;
using nccl::Comm;
using nccl::Fn;

namespace {

// The graph a capturing stream is building and the nodes it had before a launch.
struct Snapshot {
  CUgraph graph = nullptr;
  std::unordered_set<CUgraphNode> before;
};

std::vector<CUgraphNode> graph_nodes(const foundry::Driver* d, CUgraph g) {
  size_t n = 0;
  if (d->cuGraphGetNodes(g, nullptr, &n) != CUDA_SUCCESS) return {};
  std::vector<CUgraphNode> nodes(n);
  if (n && d->cuGraphGetNodes(g, nodes.data(), &n) != CUDA_SUCCESS) return {};
  nodes.resize(n);
  return nodes;
}

// False when the stream is not capturing (the launch runs now and there is nothing to record).
bool snapshot(CUstream stream, Snapshot* out) {
  const foundry::Driver* d = foundry::driver_if_open();
  if (d == nullptr) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  if (d->cuStreamGetCaptureInfo(stream, &status, nullptr, &graph, nullptr, nullptr, nullptr) != CUDA_SUCCESS ||
      status != CU_STREAM_CAPTURE_STATUS_ACTIVE || graph == nullptr)
    return false;
  out->graph = graph;
  for (CUgraphNode n : graph_nodes(d, graph)) out->before.insert(n);
  return true;
}

// The kernel nodes added since the snapshot, in the graph's order.
std::vector<CUgraphNode> added_kernels(const Snapshot& s) {
  const foundry::Driver* d = foundry::driver_if_open();
  std::vector<CUgraphNode> out;
  for (CUgraphNode n : graph_nodes(d, s.graph)) {
    CUgraphNodeType t;
    if (s.before.count(n) == 0 && d->cuGraphNodeGetType(n, &t) == CUDA_SUCCESS && t == CU_GRAPH_NODE_TYPE_KERNEL)
      out.push_back(n);
  }
  return out;
}

// A call as the wrapper saw it. Its communicator's ordinal and shape are looked up only when the
// launch is recorded (during capture): every eager collective passes through here too.
struct PendingCall {
  CollectiveCall call;
  Comm comm = nullptr;
};

std::vector<CollectiveCall> resolved(const std::vector<PendingCall>& pending) {
  std::vector<CollectiveCall> calls;
  for (const PendingCall& p : pending) {
    CollectiveCall c = p.call;
    c.comm = CollectiveLog::instance().ordinal(p.comm);
    nccl::comm_shape(p.comm, &c.nranks, &c.rank);
    calls.push_back(c);
  }
  return calls;
}

// The calls made between ncclGroupStart and the matching ncclGroupEnd on this thread. A group
// that also holds a call Foundry does not record (ncclSend, ncclRecv) is not recorded at all:
// its kernels would not be what the recorded calls make.
struct GroupState {
  int depth = 0;
  bool unrecorded = false;
  std::vector<PendingCall> calls;
  CUstream stream = nullptr;
};
thread_local GroupState group;

template <typename F>
int launch(const PendingCall& call, CUstream stream, F&& real) {
  if (group.depth > 0) {
    if (group.calls.empty()) group.stream = stream;
    group.calls.push_back(call);
    return real();
  }
  Snapshot s;
  bool capturing = snapshot(stream, &s);
  int r = real();
  if (capturing && r == nccl::kSuccess) CollectiveLog::instance().record(s.graph, added_kernels(s), resolved({call}));
  return r;
}

PendingCall make_call(CollectiveOp op, const void* send, void* recv, size_t count, int dtype, int redop, int root,
                      Comm comm) {
  PendingCall p;
  p.comm = comm;
  CollectiveCall& c = p.call;
  c.op = static_cast<uint32_t>(op);
  c.send = reinterpret_cast<uint64_t>(send);
  c.recv = reinterpret_cast<uint64_t>(recv);
  c.count = count;
  c.dtype = dtype, c.redop = redop, c.root = root;
  return p;
}

int created(int r, Comm* comm) {
  // Non-blocking communicators return ncclInProgress with the handle already set; on failure
  // NCCL may not have written it at all.
  bool made = r == nccl::kSuccess || r == nccl::kInProgress;
  if (made && comm != nullptr && *comm != nullptr) CollectiveLog::instance().add_comm(*comm);
  return r;
}

}  // namespace

#define FOUNDRY_NCCL_REAL(fn, type)                \
  auto real_fn = nccl::real_as<nccl::type>(Fn::fn); \
  if (real_fn == nullptr) return nccl::kSystemError;

FOUNDRY_EXPORT int ncclAllReduce(const void* send, void* recv, size_t count, int dtype, int op, Comm comm, CUstream s) {
  FOUNDRY_NCCL_REAL(ncclAllReduce, AllReduceFn)
  return launch(make_call(CollectiveOp::kAllReduce, send, recv, count, dtype, op, 0, comm), s,
                [&] { return real_fn(send, recv, count, dtype, op, comm, s); });
}

FOUNDRY_EXPORT int ncclAllGather(const void* send, void* recv, size_t count, int dtype, Comm comm, CUstream s) {
  FOUNDRY_NCCL_REAL(ncclAllGather, AllGatherFn)
  return launch(make_call(CollectiveOp::kAllGather, send, recv, count, dtype, 0, 0, comm), s,
                [&] { return real_fn(send, recv, count, dtype, comm, s); });
}

FOUNDRY_EXPORT int ncclReduceScatter(const void* send, void* recv, size_t count, int dtype, int op, Comm comm,
                                     CUstream s) {
  FOUNDRY_NCCL_REAL(ncclReduceScatter, ReduceScatterFn)
  return launch(make_call(CollectiveOp::kReduceScatter, send, recv, count, dtype, op, 0, comm), s,
                [&] { return real_fn(send, recv, count, dtype, op, comm, s); });
}

FOUNDRY_EXPORT int ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root, Comm comm,
                                 CUstream s) {
  FOUNDRY_NCCL_REAL(ncclBroadcast, BroadcastFn)
  return launch(make_call(CollectiveOp::kBroadcast, send, recv, count, dtype, 0, root, comm), s,
                [&] { return real_fn(send, recv, count, dtype, root, comm, s); });
}

FOUNDRY_EXPORT int ncclReduce(const void* send, void* recv, size_t count, int dtype, int op, int root, Comm comm,
                              CUstream s) {
  FOUNDRY_NCCL_REAL(ncclReduce, ReduceFn)
  return launch(make_call(CollectiveOp::kReduce, send, recv, count, dtype, op, root, comm), s,
                [&] { return real_fn(send, recv, count, dtype, op, root, comm, s); });
}

FOUNDRY_EXPORT int ncclSend(const void* send, size_t count, int dtype, int peer, Comm comm, CUstream s) {
  FOUNDRY_NCCL_REAL(ncclSend, SendFn)
  if (group.depth > 0) group.unrecorded = true;
  return real_fn(send, count, dtype, peer, comm, s);
}

FOUNDRY_EXPORT int ncclRecv(void* recv, size_t count, int dtype, int peer, Comm comm, CUstream s) {
  FOUNDRY_NCCL_REAL(ncclRecv, RecvFn)
  if (group.depth > 0) group.unrecorded = true;
  return real_fn(recv, count, dtype, peer, comm, s);
}

FOUNDRY_EXPORT int ncclGroupStart() {
  FOUNDRY_NCCL_REAL(ncclGroupStart, GroupFn)
  int r = real_fn();
  if (r == nccl::kSuccess) ++group.depth;
  return r;
}

FOUNDRY_EXPORT int ncclGroupEnd() {
  FOUNDRY_NCCL_REAL(ncclGroupEnd, GroupFn)
  if (group.depth > 0) --group.depth;
  if (group.depth > 0) return real_fn();
  std::vector<PendingCall> calls = std::move(group.calls);
  bool unrecorded = group.unrecorded;
  CUstream stream_of_group = group.stream;
  group = GroupState{};
  if (calls.empty() || unrecorded) return real_fn();
  Snapshot s;
  bool capturing = snapshot(stream_of_group, &s);
  int r = real_fn();
  if (capturing && r == nccl::kSuccess) CollectiveLog::instance().record(s.graph, added_kernels(s), resolved(calls));
  return r;
}

FOUNDRY_EXPORT int ncclCommInitRank(Comm* comm, int nranks, nccl::UniqueId id, int rank) {
  FOUNDRY_NCCL_REAL(ncclCommInitRank, CommInitRankFn)
  return created(real_fn(comm, nranks, id, rank), comm);
}

FOUNDRY_EXPORT int ncclCommInitRankConfig(Comm* comm, int nranks, nccl::UniqueId id, int rank, void* config) {
  FOUNDRY_NCCL_REAL(ncclCommInitRankConfig, CommInitRankConfigFn)
  return created(real_fn(comm, nranks, id, rank, config), comm);
}

FOUNDRY_EXPORT int ncclCommInitRankScalable(Comm* comm, int nranks, int rank, int n_ids, nccl::UniqueId* ids,
                                            void* config) {
  FOUNDRY_NCCL_REAL(ncclCommInitRankScalable, CommInitRankScalableFn)
  return created(real_fn(comm, nranks, rank, n_ids, ids, config), comm);
}

FOUNDRY_EXPORT int ncclCommInitAll(Comm* comms, int ndev, const int* devlist) {
  FOUNDRY_NCCL_REAL(ncclCommInitAll, CommInitAllFn)
  int r = real_fn(comms, ndev, devlist);
  for (int i = 0; comms != nullptr && i < ndev; ++i) created(r, &comms[i]);
  return r;
}

FOUNDRY_EXPORT int ncclCommDestroy(Comm comm) {
  FOUNDRY_NCCL_REAL(ncclCommDestroy, CommFn)
  CollectiveLog::instance().remove_comm(comm);
  return real_fn(comm);
}

FOUNDRY_EXPORT int ncclCommAbort(Comm comm) {
  FOUNDRY_NCCL_REAL(ncclCommAbort, CommFn)
  CollectiveLog::instance().remove_comm(comm);
  return real_fn(comm);
}

FOUNDRY_EXPORT int ncclCommSplit(Comm comm, int color, int key, Comm* newcomm, void* config) {
  FOUNDRY_NCCL_REAL(ncclCommSplit, CommSplitFn)
  return created(real_fn(comm, color, key, newcomm, config), newcomm);
}

namespace foundry {

void* nccl_handler_for_symbol(const char* name, void* found) {
  static void* const handlers[] = {
#define FOUNDRY_NCCL_HANDLER(name, type) reinterpret_cast<void*>(&::name),
      FOUNDRY_NCCL_FUNCTIONS(FOUNDRY_NCCL_HANDLER)
#undef FOUNDRY_NCCL_HANDLER
  };
  int i = nccl::index_of(name);
  if (i < 0 || found == nullptr || found == handlers[i]) return found;
  // A second libnccl (another copy than the one Foundry calls) answers for itself.
  return nccl::remember_real(i, found) ? handlers[i] : found;
}

}  // namespace foundry
