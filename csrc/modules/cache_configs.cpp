#include "modules/cache_configs.h"

#include "graph/model.h"

namespace foundry {

CacheConfigLog& CacheConfigLog::instance() {
  static CacheConfigLog* log = new CacheConfigLog();  // never destroyed: handlers may run during exit
  return *log;
}

namespace {

// What a note may record: a handle, the module or library it belongs to (else nothing would
// forget it when that is unloaded, and a later function given the same handle value would
// inherit the preference) and a CUfunc_cache value (anything else would end up in an archive).
bool notable(const void* handle, const void* owner, int32_t config) {
  return handle != nullptr && owner != nullptr && config >= kCachePreferNone && config <= kCachePreferEqual;
}

}  // namespace

void CacheConfigLog::note_function(CUfunction func, CUmodule owner, int32_t config) {
  if (!notable(func, owner, config)) return;
  std::lock_guard<std::mutex> lock(mu_);
  functions_[func] = Entry{owner, config};
}

void CacheConfigLog::note_kernel(CUkernel kern, CUdevice dev, CUlibrary owner, int32_t config) {
  if (!notable(kern, owner, config)) return;
  std::lock_guard<std::mutex> lock(mu_);
  kernels_[{kern, dev}] = Entry{owner, config};
}

int32_t CacheConfigLog::get(CUfunction func, CUkernel kern, CUdevice dev) const {
  std::lock_guard<std::mutex> lock(mu_);
  // A setting on the function is the more specific one: it is what a launch of that handle uses.
  if (func != nullptr) {
    auto it = functions_.find(func);
    if (it != functions_.end()) return it->second.config;
  }
  if (kern != nullptr) {
    auto it = kernels_.find({kern, dev});
    if (it != kernels_.end()) return it->second.config;
  }
  return kCachePreferNone;
}

void CacheConfigLog::forget_owner(void* owner) {
  if (owner == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = functions_.begin(); it != functions_.end();) it = it->second.owner == owner ? functions_.erase(it) : std::next(it);
  for (auto it = kernels_.begin(); it != kernels_.end();) it = it->second.owner == owner ? kernels_.erase(it) : std::next(it);
}

}  // namespace foundry
