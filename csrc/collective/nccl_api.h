// The slice of NCCL's C API that Foundry interposes and calls, declared here so that Foundry
// builds without NCCL's headers (these signatures have been stable since NCCL 2.0). The real
// functions are found in whatever libnccl the process loaded; Foundry never loads NCCL itself.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "graph/model.h"

namespace foundry::nccl {

using Comm = void*;
constexpr int kSuccess = 0;
constexpr int kSystemError = 2;   // ncclSystemError: the real library could not be found
constexpr int kInvalidUsage = 5;  // ncclInvalidUsage
constexpr int kInProgress = 7;    // ncclInProgress: a non-blocking communicator being created

struct UniqueId {
  char internal[128];
};

// CollectiveCall::op. Point-to-point (ncclSend/ncclRecv) is not recorded yet.
enum class CollectiveOp : uint32_t { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2, kBroadcast = 3, kReduce = 4 };
static_assert(static_cast<uint32_t>(CollectiveOp::kReduce) == kMaxCollectiveOp, "graph/model.h names the last op");
const char* op_name(uint32_t op);

using AllReduceFn = int (*)(const void*, void*, size_t, int, int, Comm, CUstream);
using AllGatherFn = int (*)(const void*, void*, size_t, int, Comm, CUstream);
using ReduceScatterFn = int (*)(const void*, void*, size_t, int, int, Comm, CUstream);
using BroadcastFn = int (*)(const void*, void*, size_t, int, int, Comm, CUstream);
using ReduceFn = int (*)(const void*, void*, size_t, int, int, int, Comm, CUstream);
using GroupFn = int (*)();
using CommInitRankFn = int (*)(Comm*, int, UniqueId, int);
using CommInitRankConfigFn = int (*)(Comm*, int, UniqueId, int, void*);
using CommInitAllFn = int (*)(Comm*, int, const int*);
using CommSplitFn = int (*)(Comm, int, int, Comm*, void*);
using CommInitRankScalableFn = int (*)(Comm*, int, int, int, UniqueId*, void*);

using SendFn = int (*)(const void*, size_t, int, int, Comm, CUstream);
using RecvFn = int (*)(void*, size_t, int, int, Comm, CUstream);
using CommFn = int (*)(Comm);
using CommQueryFn = int (*)(Comm, int*);

// The entry points Foundry interposes, by name, in one list shared by the resolver, the exported
// handlers and the interposer's dlsym answer. ncclSend / ncclRecv are interposed only to mark a
// group that holds them: such a launch is not recorded, so SAVE refuses its kernels.
#define FOUNDRY_NCCL_FUNCTIONS(X)                                                                        \
  X(ncclAllReduce, AllReduceFn) X(ncclAllGather, AllGatherFn) X(ncclReduceScatter, ReduceScatterFn)     \
  X(ncclBroadcast, BroadcastFn) X(ncclReduce, ReduceFn) X(ncclGroupStart, GroupFn) X(ncclGroupEnd, GroupFn) \
  X(ncclCommInitRank, CommInitRankFn) X(ncclCommInitRankConfig, CommInitRankConfigFn)                    \
  X(ncclCommInitAll, CommInitAllFn) X(ncclCommSplit, CommSplitFn)                                         \
  X(ncclCommInitRankScalable, CommInitRankScalableFn) X(ncclSend, SendFn) X(ncclRecv, RecvFn)            \
  X(ncclCommDestroy, CommFn) X(ncclCommAbort, CommFn)
// Called, never interposed: what SAVE records about a communicator and LOAD checks.
#define FOUNDRY_NCCL_QUERIES(X) X(ncclCommCount, CommQueryFn) X(ncclCommUserRank, CommQueryFn)

enum class Fn : int {
#define FOUNDRY_NCCL_ENUM(name, type) name,
  FOUNDRY_NCCL_FUNCTIONS(FOUNDRY_NCCL_ENUM) FOUNDRY_NCCL_QUERIES(FOUNDRY_NCCL_ENUM)
#undef FOUNDRY_NCCL_ENUM
      kCount
};

// The real NCCL function, or nullptr when no libnccl is loaded (resolved once it is).
void* real(Fn fn);
template <typename T>
T real_as(Fn fn) {
  return reinterpret_cast<T>(real(fn));
}
// The index of an interposed name, or -1. Used by the dlsym answer, which also hands over the
// real function it found (`found`), so a library opened with RTLD_LOCAL is reachable too.
int index_of(const char* name);
// Makes `found` the real function of interposed entry point `index` unless another one already
// is; true when `found` is (now) the one Foundry calls. A second libnccl in the process is not
// interposed: its communicators must never reach the first library.
bool remember_real(int index, void* found);

// The communicator's size and this process's rank in it; false when NCCL cannot say.
bool comm_shape(Comm comm, int32_t* nranks, int32_t* rank);

// Makes one recorded call with the real NCCL, on `stream` (the calls of a group between
// ncclGroupStart and ncclGroupEnd).
Status issue(const std::vector<CollectiveCall>& calls, CUstream stream);

}  // namespace foundry::nccl
