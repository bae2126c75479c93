// Memory entry points: allocations made while the region is active get region addresses; frees
// and reservation releases of region memory come back to the region; everything else is the
// driver's.
#include <cinttypes>

#include "common/log.h"
#include "common/strict.h"
#include "driver/driver.h"
#include "intercept/handlers.h"
#include "intercept/table.h"
#include "region/region.h"

using foundry::Region;

namespace {

const foundry::Driver* real() { return foundry::driver_for_handlers(); }

// A region allocation failed: strict mode reports out-of-memory to the caller (who raises);
// otherwise the allocation falls back to the driver, loudly.
CUresult region_failure(const foundry::Status& s, size_t bytes, CUdeviceptr* dptr) {
  if (foundry::strict_mode()) {
    LOG_ERROR("region allocation of %zu bytes refused: %s", bytes, s.message().c_str());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  LOG_WARNING("region allocation of %zu bytes failed (%s); falling back to cuMemAlloc outside the region", bytes,
              s.message().c_str());
  Region::instance().note_outside(bytes);
  return real()->cuMemAlloc(dptr, bytes);
}

}  // namespace

FOUNDRY_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  foundry::count(foundry::kAllocationsSeen);
  Region& region = Region::instance();
  if (dptr == nullptr || bytesize == 0 || !region.accepts_allocations()) return real()->cuMemAlloc(dptr, bytesize);
  auto ptr = region.alloc(bytesize);
  if (!ptr.ok()) return region_failure(ptr.status(), bytesize, dptr);
  *dptr = static_cast<CUdeviceptr>(ptr.value());
  return CUDA_SUCCESS;
}

FOUNDRY_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                            unsigned int ElementSizeBytes) {
  foundry::count(foundry::kAllocationsSeen);
  Region& region = Region::instance();
  if (dptr == nullptr || pPitch == nullptr || !region.accepts_allocations()) {
    return real()->cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  }
  // A fixed pitch rule keeps the size (and so the layout) deterministic; 512 bytes satisfies
  // the texture pitch alignment of every current GPU.
  size_t pitch = (WidthInBytes + 511) / 512 * 512;
  auto ptr = region.alloc(pitch * (Height ? Height : 1));
  if (!ptr.ok()) {
    if (foundry::strict_mode()) return region_failure(ptr.status(), pitch * Height, dptr);
    return real()->cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  }
  *dptr = static_cast<CUdeviceptr>(ptr.value());
  *pPitch = pitch;
  return CUDA_SUCCESS;
}

FOUNDRY_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  Region& region = Region::instance();
  if (dptr != 0 && region.owns(dptr)) {
    foundry::Status s = region.free(dptr);
    if (s.ok()) return CUDA_SUCCESS;
    LOG_ERROR("freeing region memory at 0x%" PRIx64 " failed: %s", static_cast<uint64_t>(dptr), s.message().c_str());
    return s.code() == FOUNDRY_ERR_DIVERGENCE ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_UNKNOWN;
  }
  return real()->cuMemFree(dptr);
}

FOUNDRY_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                             unsigned long long flags) {
  Region& region = Region::instance();
  // A caller asking for a specific address keeps its own placement.
  if (ptr == nullptr || addr != 0 || !region.accepts_allocations()) {
    return real()->cuMemAddressReserve(ptr, size, alignment, addr, flags);
  }
  auto got = region.reserve(size, alignment);
  if (!got.ok()) {
    if (foundry::strict_mode()) {
      LOG_ERROR("region reservation of %zu bytes refused: %s", size, got.status().message().c_str());
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    LOG_WARNING("region reservation of %zu bytes failed (%s); reserving outside the region", size,
                got.status().message().c_str());
    region.note_outside(size);
    return real()->cuMemAddressReserve(ptr, size, alignment, addr, flags);
  }
  *ptr = static_cast<CUdeviceptr>(got.value());
  return CUDA_SUCCESS;
}

FOUNDRY_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Region& region = Region::instance();
  if (region.owns_reservation(ptr)) {
    foundry::Status s = region.unreserve(ptr, size);
    if (s.ok()) return CUDA_SUCCESS;
    LOG_ERROR("releasing a region reservation failed: %s", s.message().c_str());
    return CUDA_ERROR_INVALID_VALUE;
  }
  return real()->cuMemAddressFree(ptr, size);
}
