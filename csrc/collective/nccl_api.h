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

struct UniqueId {
  char internal[128];
};

// CollectiveCall::op. Point-to-point (ncclSend/ncclRecv) is not recorded yet.
enum class CollectiveOp : uint32_t { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2, kBroadcast = 3, kReduce = 4 };
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

// Entry points by name, in one list shared by the resolver and the interposer's dlsym answer.
#define FOUNDRY_NCCL_FUNCTIONS(X)                                                                        \
  X(ncclAllReduce, AllReduceFn) X(ncclAllGather, AllGatherFn) X(ncclReduceScatter, ReduceScatterFn)     \
  X(ncclBroadcast, BroadcastFn) X(ncclReduce, ReduceFn) X(ncclGroupStart, GroupFn) X(ncclGroupEnd, GroupFn) \
  X(ncclCommInitRank, CommInitRankFn) X(ncclCommInitRankConfig, CommInitRankConfigFn)                    \
  X(ncclCommInitAll, CommInitAllFn) X(ncclCommSplit, CommSplitFn)                                         \
  X(ncclCommInitRankScalable, CommInitRankScalableFn)

enum class Fn : int {
#define FOUNDRY_NCCL_ENUM(name, type) name,
  FOUNDRY_NCCL_FUNCTIONS(FOUNDRY_NCCL_ENUM)
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
void remember_real(int index, void* found);

// Makes one recorded call with the real NCCL, on `stream` (the calls of a group between
// ncclGroupStart and ncclGroupEnd).
Status issue(const std::vector<CollectiveCall>& calls, CUstream stream);

}  // namespace foundry::nccl
