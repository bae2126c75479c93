// The declarative interposition table: driver symbol -> Foundry handler. Both lookup paths
// (dlsym and cuGetProcAddress) consult it, and nothing else decides what is interposed.
#pragma once

#include <cstdint>

namespace foundry {

struct InterposedSymbol {
  const char* symbol;  // exact libcuda export, e.g. "cuMemAlloc_v2"
  const char* base;    // the name cuGetProcAddress is asked for, e.g. "cuMemAlloc"
  int min_version;     // the lowest cudaVersion for which `base` resolves to `symbol`
  void* handler;
};

// The handler for an exact exported name, or nullptr.
void* handler_for_symbol(const char* symbol);
// The interposed NCCL entry point for `name` when Foundry has one (remembering `found`, the real
// function the lookup found, for it to call), else `found` itself.
void* nccl_handler_for_symbol(const char* name, void* found);
// The handler for a cuGetProcAddress query (base name, requested CUDA version), or nullptr.
// Names already carrying a version suffix ("cuMemAlloc_v2") are matched exactly.
void* handler_for_query(const char* base, int cuda_version);

enum Counter { kProcAddressAnswers = 0, kDlsymAnswers = 1, kAllocationsSeen = 2, kImageLoadsSeen = 3, kCounterCount };
void count(Counter c);
int64_t counter(int index);

// 1 when this library came into the process through LD_PRELOAD.
bool preload_active();

}  // namespace foundry
