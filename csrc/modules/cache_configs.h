// The cache preference (CUfunc_cache) the process set on each function and kernel. The driver has
// cuFuncSetCacheConfig / cuKernelSetCacheConfig but no getter, so SAVE can only know a kernel's
// preference by watching those calls (intercept/function_handlers.cpp); LOAD notes what it sets
// itself, so the record stays what the process asked for. Handles are opaque keys here (no driver
// call), each remembered with the module or library it belongs to, so that unloading that module
// forgets them before the driver can hand the same handle value to another function.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace foundry {

class CacheConfigLog {
 public:
  static CacheConfigLog& instance();

  // A note without a handle or an owner, or whose config is not a CUfunc_cache value, is ignored.
  void note_function(CUfunction func, CUmodule owner, int32_t config);
  // cuKernelSetCacheConfig sets the preference for one device.
  void note_kernel(CUkernel kern, CUdevice dev, CUlibrary owner, int32_t config);
  // The most recent preference set on `func`, else on `kern` for `dev`; kCachePreferNone when
  // neither was set (the driver's default).
  int32_t get(CUfunction func, CUkernel kern, CUdevice dev) const;
  // After a module or library was unloaded: its functions' handles may be reused.
  void forget_owner(void* module_or_library);

 private:
  struct Entry {
    void* owner = nullptr;
    int32_t config = 0;
  };
  mutable std::mutex mu_;
  std::map<CUfunction, Entry> functions_;
  std::map<std::pair<CUkernel, CUdevice>, Entry> kernels_;
};

}  // namespace foundry
