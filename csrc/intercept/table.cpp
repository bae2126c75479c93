#include "intercept/table.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

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

namespace {

// The LD_PRELOAD this process was exec'ed with, which is what the dynamic loader preloaded. The
// live environment may say otherwise: a process that leaves the preload to its children puts the
// library in its own LD_PRELOAD for them (foundry-core's start-up hook), and a program may drop
// the variable once started. /proc/self/environ keeps the exec-time block; getenv is the
// fallback where it cannot be read.
std::string exec_time_preload() {
  std::FILE* f = std::fopen("/proc/self/environ", "rb");
  if (f == nullptr) {
    const char* live = std::getenv("LD_PRELOAD");
    return live ? live : "";
  }
  std::string block;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) block.append(buf, n);
  std::fclose(f);
  static const char kKey[] = "LD_PRELOAD=";
  const size_t key_len = sizeof kKey - 1;
  for (size_t pos = 0; pos < block.size();) {
    size_t end = block.find('\0', pos);
    if (end == std::string::npos) end = block.size();
    if (block.compare(pos, key_len, kKey) == 0) return block.substr(pos + key_len, end - pos - key_len);
    pos = end + 1;
  }
  return "";
}

}  // namespace

bool preload_active() {
  static const bool active = [] {
    const std::string preload = exec_time_preload();
    Dl_info self{};
    if (preload.empty() || dladdr(reinterpret_cast<void*>(&preload_active), &self) == 0 || !self.dli_fname) return false;
    const char* base = std::strrchr(self.dli_fname, '/');
    base = base ? base + 1 : self.dli_fname;
    return preload.find(base) != std::string::npos;
  }();
  return active;
}

}  // namespace foundry
