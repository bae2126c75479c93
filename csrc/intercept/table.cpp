#include "intercept/table.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "intercept/handlers.h"

namespace foundry {
namespace {

#define H(fn) reinterpret_cast<void*>(&fn)
// Versions: the _v2 memory entry points replaced the originals in CUDA 3.2 (3020);
// cuGetProcAddress_v2 arrived in CUDA 12.0 (12000).
const InterposedSymbol kTable[] = {
    {"cuGetProcAddress", "cuGetProcAddress", 0, H(handler_cuGetProcAddress_v1)},
    {"cuGetProcAddress_v2", "cuGetProcAddress", 12000, H(cuGetProcAddress_v2)},
    {"cuMemAlloc_v2", "cuMemAlloc", 3020, H(cuMemAlloc_v2)},
    {"cuMemAllocPitch_v2", "cuMemAllocPitch", 3020, H(cuMemAllocPitch_v2)},
    {"cuMemFree_v2", "cuMemFree", 3020, H(cuMemFree_v2)},
    {"cuMemAddressReserve", "cuMemAddressReserve", 0, H(cuMemAddressReserve)},
    {"cuMemAddressFree", "cuMemAddressFree", 0, H(cuMemAddressFree)},
    {"cuModuleLoad", "cuModuleLoad", 0, H(cuModuleLoad)},
    {"cuModuleLoadData", "cuModuleLoadData", 0, H(cuModuleLoadData)},
    {"cuModuleLoadDataEx", "cuModuleLoadDataEx", 0, H(cuModuleLoadDataEx)},
    {"cuModuleLoadFatBinary", "cuModuleLoadFatBinary", 0, H(cuModuleLoadFatBinary)},
    {"cuModuleUnload", "cuModuleUnload", 0, H(cuModuleUnload)},
    {"cuLibraryLoadData", "cuLibraryLoadData", 0, H(cuLibraryLoadData)},
    {"cuLibraryLoadFromFile", "cuLibraryLoadFromFile", 0, H(cuLibraryLoadFromFile)},
    {"cuLibraryUnload", "cuLibraryUnload", 0, H(cuLibraryUnload)},
    {"cuFuncSetCacheConfig", "cuFuncSetCacheConfig", 0, H(cuFuncSetCacheConfig)},
    {"cuKernelSetCacheConfig", "cuKernelSetCacheConfig", 0, H(cuKernelSetCacheConfig)},
};
#undef H

std::atomic<int64_t> g_counters[kCounterCount];

}  // namespace

void* handler_for_symbol(const char* symbol) {
  for (const InterposedSymbol& s : kTable) {
    if (std::strcmp(s.symbol, symbol) == 0) return s.handler;
  }
  return nullptr;
}

void* handler_for_query(const char* base, int cuda_version) {
  const InterposedSymbol* best = nullptr;
  for (const InterposedSymbol& s : kTable) {
    if (std::strcmp(s.base, base) == 0 && cuda_version >= s.min_version && (!best || s.min_version > best->min_version)) {
      best = &s;
    }
  }
  if (best) return best->handler;
  // A versioned name asked for directly (not the documented usage, but harmless to honour).
  return handler_for_symbol(base);
}

void count(Counter c) { g_counters[c].fetch_add(1, std::memory_order_relaxed); }

int64_t counter(int index) {
  return index >= 0 && index < kCounterCount ? g_counters[index].load(std::memory_order_relaxed) : -1;
}

bool preload_active() {
  static const bool active = [] {
    const char* preload = std::getenv("LD_PRELOAD");
    Dl_info self{};
    if (preload == nullptr || dladdr(reinterpret_cast<void*>(&preload_active), &self) == 0 || !self.dli_fname) return false;
    const char* base = std::strrchr(self.dli_fname, '/');
    base = base ? base + 1 : self.dli_fname;
    return std::strstr(preload, base) != nullptr;
  }();
  return active;
}

}  // namespace foundry
