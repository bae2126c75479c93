#include "modules/cache_configs.h"

#include "graph/model.h"

namespace foundry {

CacheConfigLog& CacheConfigLog::instance() {
  static CacheConfigLog* log = new CacheConfigLog();  // never destroyed: handlers may run during exit
  return *log;
}

void CacheConfigLog::note_function(CUfunction func, CUmodule owner, int32_t config) {
  if (func == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  functions_[func] = Entry{owner, config};
}

void CacheConfigLog::note_kernel(CUkernel kern, CUdevice dev, CUlibrary owner, int32_t config) {
  if (kern == nullptr) return;
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
