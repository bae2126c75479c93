#include "intercept/table.h"

#include <dlfcn.h>
#include <link.h>

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

namespace {

struct LoadOrder {
  const char* self;  // this library's path, as the dynamic loader names it
  int index = 0;
  int self_index = -1;
  int libc_index = -1;
};

int note_object(struct dl_phdr_info* info, size_t, void* data) {
  auto* order = static_cast<LoadOrder*>(data);
  const char* name = info->dlpi_name ? info->dlpi_name : "";
  const char* base = std::strrchr(name, '/');
  base = base ? base + 1 : name;
  if (order->self_index < 0 && std::strcmp(name, order->self) == 0) order->self_index = order->index;
  if (order->libc_index < 0 && std::strncmp(base, "libc.so", 7) == 0) order->libc_index = order->index;
  ++order->index;
  return 0;
}

}  // namespace

// Preloaded means loaded by the dynamic loader at exec, ahead of the program's own libraries: the
// loader maps LD_PRELOAD's objects before the executable's dependencies, so this library comes
// before libc in the load order; one dlopen'ed later comes after it. Neither the live LD_PRELOAD
// (a process may set it for its children only, as foundry-core's start-up hook does) nor
// /proc/self/environ (setproctitle, which vLLM's processes call, writes over it) can tell.
bool preload_active() {
  static const bool active = [] {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&preload_active), &self) == 0 || !self.dli_fname) return false;
    LoadOrder order{self.dli_fname};
    dl_iterate_phdr(note_object, &order);
    if (order.self_index >= 0 && order.libc_index >= 0) return order.self_index < order.libc_index;
    // A program without libc.so in its load order (statically linked): the environment decides.
    const char* preload = std::getenv("LD_PRELOAD");
    const char* base = std::strrchr(self.dli_fname, '/');
    base = base ? base + 1 : self.dli_fname;
    return preload != nullptr && std::strstr(preload, base) != nullptr;
  }();
  return active;
}

}  // namespace foundry
