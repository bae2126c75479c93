#include "region/region.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "common/log.h"
#include "common/strict.h"
#include "driver/driver.h"

namespace foundry {
namespace {

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

}  // namespace

Region& Region::instance() {
  static Region* r = new Region();  // never destroyed: handlers may run during process exit
  return *r;
}

Status Region::set(uint64_t base, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (set_) {
    return Error(FOUNDRY_ERR_STATE, "an allocation region is already set at " + hex(base_) +
                                        "; release it (foundry_region_release) before setting another");
  }
  auto dev = current_device();
  if (!dev.ok()) return dev.status();
  const Driver* d = driver_if_open();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev.value();
  size_t granularity = 0;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(
      d->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"));
  if (base % granularity != 0 || size == 0) {
    return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "region base " + hex(base) + " must be a multiple of the allocation granularity " +
                                                   hex(granularity) + " and the size non-zero (got " + hex(size) + ")");
  }
  if (size % granularity != 0) {
    // A size such as parse_size("1GB") = 10^9 bytes is rarely a multiple of the granularity;
    // the region is an address range, so rounding it up costs no memory.
    uint64_t rounded = (size + granularity - 1) / granularity * granularity;
    LOG_INFO("region size %" PRIu64 " bytes rounded up to %" PRIu64 " (a multiple of the allocation granularity %s)",
             size, rounded, hex(granularity).c_str());
    size = rounded;
  }
  CUdeviceptr got = 0;
  CUresult r = d->cuMemAddressReserve(&got, size, granularity, static_cast<CUdeviceptr>(base), 0);
  if (r != CUDA_SUCCESS) {
    Status s = cuda_error(r, "cuMemAddressReserve");
    return Error(FOUNDRY_ERR_FIXED_ADDRESS, "cannot reserve the region [" + hex(base) + ", +" + hex(size) + "): " + s.message());
  }
  if (got != base) {
    d->cuMemAddressFree(got, size);
    return Error(FOUNDRY_ERR_FIXED_ADDRESS, "the driver placed the region at " + hex(got) + " instead of " + hex(base) +
                                                " (the range is taken in this process); choose another base");
  }
  base_ = base;
  device_ = dev.value();
  va_.reset(size, granularity);
  log_.reset();
  owned_.clear();
  prealloc_.clear();
  driver_calls_ = 0;
  set_ = active_ = true;
  LOG_INFO("allocation region set at %s, %" PRIu64 " bytes, device %d", hex(base).c_str(), size, device_);
  return Status::Ok();
}

Status Region::release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_) return Error(FOUNDRY_ERR_STATE, "no allocation region is set");
  if (!va_.live().empty()) {
    return Error(FOUNDRY_ERR_BUSY, std::to_string(va_.live().size()) + " allocations are still live in the region");
  }
  const Driver* d = driver_if_open();
  FOUNDRY_RETURN_IF_ERROR(unmap(&prealloc_, true));
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuMemAddressFree(base_, va_.size()), "cuMemAddressFree"));
  set_ = active_ = false;
  return Status::Ok();
}

Status Region::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_) return Error(FOUNDRY_ERR_STATE, "no allocation region is set");
  active_ = false;
  return Status::Ok();
}

Status Region::resume() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_) return Error(FOUNDRY_ERR_STATE, "no allocation region is set");
  active_ = true;
  return Status::Ok();
}

RegionInfo Region::info() {
  std::lock_guard<std::mutex> lock(mu_);
  RegionInfo i;
  i.base = base_;
  i.size = va_.size();
  i.set = set_;
  i.active = active_;
  i.cursor = va_.cursor();
  i.high_water = va_.high_water();
  i.live_bytes = va_.live_bytes();
  i.live_count = va_.live().size();
  return i;
}

bool Region::device_matches() {
  const Driver* d = driver_if_open();
  CUdevice dev;
  return d != nullptr && d->cuCtxGetDevice(&dev) == CUDA_SUCCESS && dev == device_;
}

bool Region::accepts_allocations() {
  std::lock_guard<std::mutex> lock(mu_);
  return set_ && active_ && device_matches();
}

bool Region::owns(uint64_t ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_ || ptr < base_ || ptr >= base_ + va_.size()) return false;
  const Block* b = va_.find(ptr - base_);
  return b != nullptr && b->offset == ptr - base_ && b->kind != BlockKind::kReserve;
}

bool Region::owns_reservation(uint64_t ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_ || ptr < base_ || ptr >= base_ + va_.size()) return false;
  const Block* b = va_.find(ptr - base_);
  return b != nullptr && b->offset == ptr - base_ && b->kind == BlockKind::kReserve;
}

Status Region::record(LogKind kind, uint64_t offset, uint64_t size) {
  if (log_.append(kind, offset, size)) return Status::Ok();
  std::string what = log_.describe_divergence();
  if (strict_mode()) return Error(FOUNDRY_ERR_DIVERGENCE, what);
  LOG_WARNING("%s", what.c_str());
  return Status::Ok();
}

Status Region::map_range(uint64_t offset, uint64_t size, std::vector<Mapping>* out) {
  const Driver* d = driver_if_open();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  CUmemGenericAllocationHandle handle;
  driver_calls_ += 3;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuMemCreate(&handle, size, &prop, 0), "cuMemCreate"));
  CUdeviceptr va = base_ + offset;
  CUresult r = d->cuMemMap(va, size, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    d->cuMemRelease(handle);
    return cuda_error(r, "cuMemMap");
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d->cuMemSetAccess(va, size, &access, 1);
  if (r != CUDA_SUCCESS) {
    d->cuMemUnmap(va, size);
    d->cuMemRelease(handle);
    return cuda_error(r, "cuMemSetAccess");
  }
  out->push_back(Mapping{offset, size, handle});
  return Status::Ok();
}

Status Region::map_uncovered(uint64_t offset, uint64_t size, std::vector<Mapping>* out) {
  // Parts already backed by a preallocated chunk need no driver call (the fast path).
  uint64_t pos = offset, end = offset + size;
  for (const Mapping& chunk : prealloc_) {
    if (pos >= end) break;
    uint64_t c_end = chunk.offset + chunk.size;
    if (c_end <= pos || chunk.offset >= end) continue;
    if (chunk.offset > pos) FOUNDRY_RETURN_IF_ERROR(map_range(pos, chunk.offset - pos, out));
    pos = std::min(c_end, end);
  }
  if (pos < end) FOUNDRY_RETURN_IF_ERROR(map_range(pos, end - pos, out));
  return Status::Ok();
}

Status Region::unmap(std::vector<Mapping>* mappings, bool synchronize) {
  if (mappings->empty()) return Status::Ok();
  const Driver* d = driver_if_open();
  // Like cuMemFree, wait for the device before the memory goes away: kernels may still use it.
  if (synchronize) FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuCtxSynchronize(), "cuCtxSynchronize (before unmapping)"));
  for (const Mapping& m : *mappings) {
    driver_calls_ += 2;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuMemUnmap(base_ + m.offset, m.size), "cuMemUnmap"));
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuMemRelease(m.handle), "cuMemRelease"));
  }
  mappings->clear();
  return Status::Ok();
}

Result<uint64_t> Region::alloc(uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_) return Error(FOUNDRY_ERR_STATE, "no allocation region is set");
  auto off = va_.allocate(size, 0, BlockKind::kAlloc);
  if (!off.ok()) return off.status();
  uint64_t rounded = va_.round_up(size);
  Status s = record(LogKind::kAlloc, off.value(), rounded);
  std::vector<Mapping> mappings;
  if (s.ok()) s = map_uncovered(off.value(), rounded, &mappings);
  if (!s.ok()) {
    unmap(&mappings, false);
    va_.release(off.value());
    return s;
  }
  if (!mappings.empty()) owned_[off.value()] = std::move(mappings);
  return base_ + off.value();
}

Status Region::free(uint64_t ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_ || ptr < base_) return Error(FOUNDRY_ERR_NOT_FOUND, "pointer " + hex(ptr) + " is not a region allocation");
  uint64_t offset = ptr - base_;
  const Block* b = va_.find(offset);
  if (b == nullptr || b->offset != offset || b->kind == BlockKind::kReserve) {
    return Error(FOUNDRY_ERR_NOT_FOUND, "pointer " + hex(ptr) + " is not the start of a region allocation");
  }
  auto it = owned_.find(offset);
  if (it != owned_.end()) {
    FOUNDRY_RETURN_IF_ERROR(unmap(&it->second, true));
    owned_.erase(it);
  }
  auto released = va_.release(offset);
  return record(LogKind::kFree, offset, released.value().size);
}

Result<uint64_t> Region::reserve(uint64_t size, uint64_t alignment) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_) return Error(FOUNDRY_ERR_STATE, "no allocation region is set");
  auto off = va_.allocate(size, alignment, BlockKind::kReserve);
  if (!off.ok()) return off.status();
  Status s = record(LogKind::kReserve, off.value(), va_.round_up(size));
  if (!s.ok()) {
    va_.release(off.value());
    return s;
  }
  return base_ + off.value();
}

Status Region::unreserve(uint64_t ptr, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t offset = ptr - base_;
  const Block* b = va_.find(offset);
  if (b == nullptr || b->offset != offset || b->kind != BlockKind::kReserve) {
    return Error(FOUNDRY_ERR_NOT_FOUND, "pointer " + hex(ptr) + " is not a region reservation");
  }
  auto released = va_.release(offset);
  return record(LogKind::kUnreserve, offset, released.value().size);
}

Status Region::claim(uint64_t offset, uint64_t size, bool* mapped) {
  std::lock_guard<std::mutex> lock(mu_);
  *mapped = false;
  if (!set_) return Error(FOUNDRY_ERR_STATE, "no allocation region is set");
  bool existing = false;
  FOUNDRY_RETURN_IF_ERROR(va_.claim(offset, size, &existing));
  if (existing) return Status::Ok();
  std::vector<Mapping> mappings;
  Status s = map_uncovered(offset, size, &mappings);
  if (!s.ok()) {
    unmap(&mappings, false);
    va_.release(offset);
    return s;
  }
  if (!mappings.empty()) owned_[offset] = std::move(mappings);
  *mapped = true;
  // Claims are not part of the application's request sequence: logged but never compared.
  log_.append(LogKind::kClaim, offset, size);
  return Status::Ok();
}

Status Region::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_) return Error(FOUNDRY_ERR_STATE, "no allocation region is set");
  offset = va_.round_up(offset);
  FOUNDRY_RETURN_IF_ERROR(va_.seal(offset));
  return record(LogKind::kSeal, offset, 0);
}

uint64_t Region::offset() {
  std::lock_guard<std::mutex> lock(mu_);
  return va_.cursor();
}

Status Region::preallocate(uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_) return Error(FOUNDRY_ERR_STATE, "no allocation region is set");
  size = va_.round_up(size);
  uint64_t start = va_.cursor();
  if (start + size > va_.size()) {
    return Error(FOUNDRY_ERR_REGION_EXHAUSTED, "preallocation of " + std::to_string(size) + " bytes at offset " + hex(start) +
                                                   " does not fit in the region of " + std::to_string(va_.size()) + " bytes");
  }
  for (const Mapping& m : prealloc_) {
    if (m.offset + m.size > start) return Error(FOUNDRY_ERR_STATE, "a preallocated chunk already covers offset " + hex(start));
  }
  std::vector<Mapping> chunk;
  FOUNDRY_RETURN_IF_ERROR(map_range(start, size, &chunk));
  prealloc_.push_back(chunk.front());
  std::sort(prealloc_.begin(), prealloc_.end(), [](const Mapping& a, const Mapping& b) { return a.offset < b.offset; });
  log_.append(LogKind::kPrealloc, start, size);  // bookkeeping, not an application request
  return Status::Ok();
}

Status Region::free_preallocated() {
  std::lock_guard<std::mutex> lock(mu_);
  if (prealloc_.empty()) return Status::Ok();
  for (const Mapping& m : prealloc_) {
    for (const auto& [off, block] : va_.live()) {
      if (off < m.offset + m.size && off + block.size > m.offset) {
        return Error(FOUNDRY_ERR_BUSY, "the preallocated chunk at offset " + hex(m.offset) + " still holds the live allocation at " +
                                           hex(base_ + off) + "; free it first");
      }
    }
  }
  return unmap(&prealloc_, true);
}

void Region::note_outside(uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  log_.append(LogKind::kOutside, 0, size);
}

AddressClass Region::classify(uint64_t addr, Block* block) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_ || addr < base_ || addr >= base_ + va_.size()) return AddressClass::kOutside;
  const Block* b = va_.find(addr - base_);
  if (b == nullptr || b->kind == BlockKind::kReserve) {
    // Reservations are the application's own mappings; their contents are not ours to vouch for.
    if (b != nullptr && block) *block = *b;
    return b == nullptr ? AddressClass::kInsideNotLive : AddressClass::kLive;
  }
  if (block) *block = *b;
  return AddressClass::kLive;
}

std::string Region::history(uint64_t addr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_ || addr < base_) return "outside the region";
  return log_.describe_offset(addr - base_);
}

WordClass Region::classify_word(uint64_t value, Block* block) {
  std::lock_guard<std::mutex> lock(mu_);
  return foundry::classify_word(value, set_ ? base_ : 0, va_, log_, block);
}

uint64_t Region::driver_calls() {
  std::lock_guard<std::mutex> lock(mu_);
  return driver_calls_;
}

uint32_t Region::set_tag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  return log_.set_tag(tag);
}

std::vector<foundry_log_entry> Region::log_entries(uint64_t first, uint64_t max) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& all = log_.entries();
  std::vector<foundry_log_entry> out;
  for (uint64_t i = first; i < all.size() && out.size() < max; ++i) out.push_back(all[i]);
  return out;
}

uint64_t Region::log_size() {
  std::lock_guard<std::mutex> lock(mu_);
  return log_.size();
}

std::string Region::log_tag(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  return log_.tag(index);
}

void Region::expect(std::vector<foundry_log_entry> expected) {
  std::lock_guard<std::mutex> lock(mu_);
  log_.expect(std::move(expected));
}

bool Region::divergence(foundry_log_entry* expected, foundry_log_entry* actual) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!log_.diverged()) return false;
  *expected = log_.divergence_expected();
  *actual = log_.divergence_actual();
  return true;
}

}  // namespace foundry
