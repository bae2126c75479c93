#include "region/va_space.h"

#include <cinttypes>
#include <cstdio>
#include <string>

namespace foundry {
namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

}  // namespace

void VaSpace::reset(uint64_t size, uint64_t granularity) {
  size_ = size;
  granularity_ = granularity ? granularity : 1;
  cursor_ = seal_ = high_water_ = live_bytes_ = 0;
  live_.clear();
  holes_.clear();
}

Result<uint64_t> VaSpace::allocate(uint64_t size, uint64_t alignment, BlockKind kind) {
  if (size == 0) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "zero-sized region allocation");
  size = round_up(size);
  alignment = align_up(alignment ? alignment : granularity_, granularity_);
  for (const auto& [hole_offset, hole_size] : holes_) {
    uint64_t start = align_up(hole_offset, alignment);
    if (start + size <= hole_offset + hole_size) {
      carve_hole(start, size);
      live_[start] = Block{start, size, kind};
      live_bytes_ += size;
      return start;
    }
  }
  uint64_t start = align_up(cursor_, alignment);
  if (start + size > size_ || start + size < start) {
    return Error(FOUNDRY_ERR_REGION_EXHAUSTED, "region exhausted: " + std::to_string(size) + " bytes requested at offset " +
                                                   hex(start) + ", region size " + hex(size_));
  }
  if (start > cursor_) add_hole(cursor_, start - cursor_);
  cursor_ = start + size;
  if (cursor_ > high_water_) high_water_ = cursor_;
  live_[start] = Block{start, size, kind};
  live_bytes_ += size;
  return start;
}

Result<Block> VaSpace::release(uint64_t offset) {
  auto it = live_.find(offset);
  if (it == live_.end()) return Error(FOUNDRY_ERR_NOT_FOUND, "no region block starts at offset " + hex(offset));
  Block b = it->second;
  live_.erase(it);
  live_bytes_ -= b.size;
  if (b.offset >= seal_) add_hole(b.offset, b.size);
  return b;
}

Status VaSpace::claim(uint64_t offset, uint64_t size, bool* existing) {
  *existing = false;
  if (size == 0 || offset % granularity_ != 0 || size % granularity_ != 0 || offset + size > size_ || offset + size < offset) {
    return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "claim of [" + hex(offset) + ", +" + hex(size) +
                                                   ") is not granularity-aligned or not inside the region");
  }
  // Any live block overlapping the range?
  auto it = live_.upper_bound(offset);
  if (it != live_.begin()) --it;
  for (; it != live_.end() && it->first < offset + size; ++it) {
    const Block& b = it->second;
    if (b.offset + b.size <= offset) continue;
    if (b.offset == offset && b.size == size) {
      *existing = true;
      return Status::Ok();
    }
    return Error(FOUNDRY_ERR_DIVERGENCE, "range [" + hex(offset) + ", +" + hex(size) + ") overlaps live block [" +
                                             hex(b.offset) + ", +" + hex(b.size) + "): the memory layout differs from the recorded one");
  }
  carve_hole(offset, size);
  if (offset + size > cursor_) {
    if (offset > cursor_) add_hole(cursor_, offset - cursor_);
    cursor_ = offset + size;
    if (cursor_ > high_water_) high_water_ = cursor_;
  }
  live_[offset] = Block{offset, size, BlockKind::kClaim};
  live_bytes_ += size;
  return Status::Ok();
}

Status VaSpace::seal(uint64_t offset) {
  if (offset < cursor_) {
    return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "cannot move the region cursor back from " + hex(cursor_) + " to " + hex(offset) +
                                                   ": memory above the new offset is already handed out");
  }
  if (offset > size_) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "offset " + hex(offset) + " is past the region end " + hex(size_));
  holes_.clear();
  cursor_ = seal_ = offset;
  if (cursor_ > high_water_) high_water_ = cursor_;
  return Status::Ok();
}

const Block* VaSpace::find(uint64_t offset) const {
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return nullptr;
  --it;
  const Block& b = it->second;
  return offset < b.offset + b.size ? &b : nullptr;
}

void VaSpace::add_hole(uint64_t offset, uint64_t size) {
  if (size == 0 || offset < seal_) return;
  auto next = holes_.lower_bound(offset);
  // Merge with the following hole.
  if (next != holes_.end() && offset + size == next->first) {
    size += next->second;
    next = holes_.erase(next);
  }
  // Merge with the preceding hole.
  if (next != holes_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  holes_[offset] = size;
}

void VaSpace::carve_hole(uint64_t offset, uint64_t size) {
  // Removes [offset, offset+size) from every hole it intersects.
  uint64_t end = offset + size;
  auto it = holes_.upper_bound(offset);
  if (it != holes_.begin()) --it;
  while (it != holes_.end() && it->first < end) {
    uint64_t h_off = it->first, h_end = it->first + it->second;
    if (h_end <= offset) {
      ++it;
      continue;
    }
    it = holes_.erase(it);
    if (h_off < offset) holes_[h_off] = offset - h_off;
    if (h_end > end) holes_[end] = h_end - end;
  }
}

}  // namespace foundry
