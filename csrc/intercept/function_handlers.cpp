// Function cache preferences: Triton (cuFuncSetCacheConfig on every kernel above 48 KiB of shared
// memory), PyTorch's Inductor launcher and the CUDA runtime (cudaFuncSetCacheConfig) set them, and
// the driver offers no way to read them back. Each successful call is noted in CacheConfigLog,
// with the module or library the handle belongs to, so that SAVE can store the preference with
// the kernel and LOAD can set it again on the archived copy.
#include "driver/driver.h"
#include "intercept/handlers.h"
#include "modules/cache_configs.h"

namespace {

const foundry::Driver* real() { return foundry::driver_for_handlers(); }

}  // namespace

FOUNDRY_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  const foundry::Driver* d = real();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuFuncSetCacheConfig(hfunc, config);
  if (r != CUDA_SUCCESS) return r;
  CUmodule owner = nullptr;
  if (d->cuFuncGetModule(&owner, hfunc) != CUDA_SUCCESS) owner = nullptr;
  foundry::CacheConfigLog::instance().note_function(hfunc, owner, static_cast<int32_t>(config));
  return r;
}

FOUNDRY_EXPORT CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev) {
  const foundry::Driver* d = real();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuKernelSetCacheConfig(kernel, config, dev);
  if (r != CUDA_SUCCESS) return r;
  CUlibrary owner = nullptr;
  if (d->cuKernelGetLibrary(&owner, kernel) != CUDA_SUCCESS) owner = nullptr;
  foundry::CacheConfigLog::instance().note_kernel(kernel, dev, owner, static_cast<int32_t>(config));
  return r;
}
