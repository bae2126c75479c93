#include "collective/nccl_api.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>
#include <string>

#include "collective/collective_log.h"
#include "driver/driver.h"

namespace foundry::nccl {
namespace {

constexpr const char* kNames[] = {
#define FOUNDRY_NCCL_NAME(name, type) #name,
    FOUNDRY_NCCL_FUNCTIONS(FOUNDRY_NCCL_NAME) FOUNDRY_NCCL_QUERIES(FOUNDRY_NCCL_NAME)
#undef FOUNDRY_NCCL_NAME
};
constexpr int kCount = static_cast<int>(Fn::kCount);
constexpr int kInterposedCount = 0
#define FOUNDRY_NCCL_ONE(name, type) +1
    FOUNDRY_NCCL_FUNCTIONS(FOUNDRY_NCCL_ONE)
#undef FOUNDRY_NCCL_ONE
    ;

std::atomic<void*>* slots() {
  static std::atomic<void*>* s = new std::atomic<void*>[kCount]();  // never destroyed: used at exit
  return s;
}

// A loaded libnccl, when the process opened it with RTLD_LOCAL (Python extensions do), so that
// RTLD_NEXT from here cannot see it.
int find_nccl(struct dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (name == nullptr || std::strstr(name, "libnccl.so") == nullptr) return 0;
  *static_cast<std::string*>(out) = name;
  return 1;
}

void* resolve(const char* name) {
  void* fn = real_dlsym(RTLD_NEXT, name);
  if (fn != nullptr) return fn;
  std::string path;
  dl_iterate_phdr(find_nccl, &path);
  if (path.empty()) return nullptr;
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  fn = real_dlsym(handle, name);
  dlclose(handle);  // RTLD_NOLOAD took a reference; the library stays loaded by its owner
  return fn;
}

}  // namespace

const char* op_name(uint32_t op) {
  switch (static_cast<CollectiveOp>(op)) {
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kReduce: return "reduce";
  }
  return "unknown";
}

void* real(Fn fn) {
  std::atomic<void*>& slot = slots()[static_cast<int>(fn)];
  void* p = slot.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = resolve(kNames[static_cast<int>(fn)]);
    if (p != nullptr) slot.store(p, std::memory_order_release);
  }
  return p;
}

int index_of(const char* name) {
  for (int i = 0; i < kInterposedCount; ++i)
    if (std::strcmp(name, kNames[i]) == 0) return i;
  return -1;
}

bool remember_real(int index, void* found) {
  if (index < 0 || index >= kInterposedCount || found == nullptr) return false;
  void* expected = nullptr;
  return slots()[index].compare_exchange_strong(expected, found) || expected == found;
}

bool comm_shape(Comm comm, int32_t* nranks, int32_t* rank) {
  auto count = real_as<CommQueryFn>(Fn::ncclCommCount);
  auto user_rank = real_as<CommQueryFn>(Fn::ncclCommUserRank);
  int n = 0, r = 0;
  if (comm == nullptr || count == nullptr || user_rank == nullptr || count(comm, &n) != kSuccess ||
      user_rank(comm, &r) != kSuccess)
    return false;
  *nranks = n;
  *rank = r;
  return true;
}

namespace {

int call_one(const CollectiveCall& c, Comm comm, CUstream s) {
  auto send = reinterpret_cast<const void*>(c.send);
  auto recv = reinterpret_cast<void*>(c.recv);
  switch (static_cast<CollectiveOp>(c.op)) {
    case CollectiveOp::kAllReduce:
      return real_as<AllReduceFn>(Fn::ncclAllReduce)(send, recv, c.count, c.dtype, c.redop, comm, s);
    case CollectiveOp::kAllGather:
      return real_as<AllGatherFn>(Fn::ncclAllGather)(send, recv, c.count, c.dtype, comm, s);
    case CollectiveOp::kReduceScatter:
      return real_as<ReduceScatterFn>(Fn::ncclReduceScatter)(send, recv, c.count, c.dtype, c.redop, comm, s);
    case CollectiveOp::kBroadcast:
      return real_as<BroadcastFn>(Fn::ncclBroadcast)(send, recv, c.count, c.dtype, c.root, comm, s);
    case CollectiveOp::kReduce:
      return real_as<ReduceFn>(Fn::ncclReduce)(send, recv, c.count, c.dtype, c.redop, c.root, comm, s);
  }
  return kInvalidUsage;
}

Fn fn_of(uint32_t op) {
  switch (static_cast<CollectiveOp>(op)) {
    case CollectiveOp::kAllReduce: return Fn::ncclAllReduce;
    case CollectiveOp::kAllGather: return Fn::ncclAllGather;
    case CollectiveOp::kReduceScatter: return Fn::ncclReduceScatter;
    case CollectiveOp::kBroadcast: return Fn::ncclBroadcast;
    case CollectiveOp::kReduce: return Fn::ncclReduce;
  }
  return Fn::kCount;
}

}  // namespace

Status issue(const std::vector<CollectiveCall>& calls, CUstream stream) {
  bool group = calls.size() > 1;
  if (group && (real(Fn::ncclGroupStart) == nullptr || real(Fn::ncclGroupEnd) == nullptr))
    return Error(FOUNDRY_ERR_STATE, "NCCL is not loaded in this process: the graphs launch NCCL collectives, so LOAD "
                                    "needs the engine's NCCL communicators created first, as at SAVE");
  for (const CollectiveCall& c : calls) {
    Fn fn = fn_of(c.op);
    if (fn == Fn::kCount) return Error(FOUNDRY_ERR_FORMAT, "unknown collective operation " + std::to_string(c.op));
    if (real(fn) == nullptr)
      return Error(FOUNDRY_ERR_STATE, std::string("NCCL is not loaded in this process (no ") + kNames[static_cast<int>(fn)] +
                                          "): the graphs launch NCCL collectives, so LOAD needs the engine's NCCL "
                                          "communicators created first, as at SAVE");
  }
  if (group) real_as<GroupFn>(Fn::ncclGroupStart)();
  int first_error = kSuccess;
  for (const CollectiveCall& c : calls) {
    Comm comm = CollectiveLog::instance().comm(c.comm);
    if (comm == nullptr) {
      if (group) real_as<GroupFn>(Fn::ncclGroupEnd)();
      return Error(FOUNDRY_ERR_MISMATCH, "NCCL communicator " + std::to_string(c.comm) + " (in the order of creation) does not exist in this "
                                         "process: create the communicators as at SAVE, before LOAD");
    }
    int32_t nranks = 0, rank = 0;
    if (comm_shape(comm, &nranks, &rank) && (nranks != c.nranks || rank != c.rank)) {
      if (group) real_as<GroupFn>(Fn::ncclGroupEnd)();
      return Error(FOUNDRY_ERR_MISMATCH, "NCCL communicator " + std::to_string(c.comm) + " (in the order of creation) has " +
                                         std::to_string(nranks) + " ranks with this process as rank " + std::to_string(rank) +
                                         "; at SAVE it had " + std::to_string(c.nranks) + " with rank " + std::to_string(c.rank) +
                                         ": communicators are created in another order than at SAVE");
    }
    int r = call_one(c, comm, stream);
    if (r != kSuccess && first_error == kSuccess) first_error = r;
  }
  if (group) {
    int r = real_as<GroupFn>(Fn::ncclGroupEnd)();
    if (r != kSuccess && first_error == kSuccess) first_error = r;
  }
  if (first_error != kSuccess)
    return Error(FOUNDRY_ERR_CUDA, std::string("NCCL ") + op_name(calls.front().op) + " failed with ncclResult " + std::to_string(first_error));
  return Status::Ok();
}

}  // namespace foundry::nccl
