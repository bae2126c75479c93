// cuGetProcAddress: the CUDA runtime (and PyTorch, through cudaGetDriverEntryPoint) obtains every
// driver function here. The real lookup runs first with the caller's version and flags, so the
// answer is the variant the caller asked for; only names in the table are then swapped for
// Foundry's handler. The CUDA 13 runtime looks up "cuGetProcAddress" itself through this path:
// answering with the handler keeps every later lookup visible.
#include "driver/driver.h"
#include "intercept/handlers.h"
#include "intercept/table.h"

namespace {

using ProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

void swap_in_handler(const char* symbol, void** pfn, int cuda_version) {
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr) return;
  void* handler = foundry::handler_for_query(symbol, cuda_version);
  if (handler == nullptr) return;
  *pfn = handler;
  foundry::count(foundry::kProcAddressAnswers);
}

}  // namespace

FOUNDRY_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus) {
  const foundry::Driver* d = foundry::driver_for_handlers();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->cuGetProcAddress(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS) swap_in_handler(symbol, pfn, cudaVersion);
  return r;
}

FOUNDRY_EXPORT CUresult handler_cuGetProcAddress_v1(const char* symbol, void** pfn, int cudaVersion,
                                                     cuuint64_t flags) {
  const foundry::Driver* d = foundry::driver_for_handlers();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto real_v1 = reinterpret_cast<ProcAddressV1>(foundry::real_dlsym(d->handle, "cuGetProcAddress"));
  CUresult r = real_v1 ? real_v1(symbol, pfn, cudaVersion, flags)
                       : d->cuGetProcAddress(symbol, pfn, cudaVersion, flags, nullptr);
  if (r == CUDA_SUCCESS) swap_in_handler(symbol, pfn, cudaVersion);
  return r;
}
