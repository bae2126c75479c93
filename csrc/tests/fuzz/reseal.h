// Shared by the fuzz targets: makes a mutated container's checksums valid again.
//
// A fuzzer cannot forge 64-bit hashes, so without resealing every input would stop at the first
// checksum and the parsers behind it (table, layout, section contents) would never be reached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/hash.h"

namespace foundry_fuzz {

inline uint64_t get_le(const std::vector<uint8_t>& b, size_t at, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
  return v;
}

inline void put64(std::vector<uint8_t>* b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*b)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// Fixes section checksums (where the section lies inside the buffer), then the table checksum,
// then the header checksum, in that order because each covers the previous.
inline void reseal(std::vector<uint8_t>* b) {
  if (b->size() < 64) return;
  uint64_t count = get_le(*b, 12, 4);
  uint64_t room = (b->size() - 64) / 32;
  if (count > room) count = room;
  for (uint64_t i = 0; i < count; ++i) {
    size_t entry = 64 + static_cast<size_t>(i) * 32;
    uint64_t offset = get_le(*b, entry + 8, 8), size = get_le(*b, entry + 16, 8);
    if (offset <= b->size() && size <= b->size() - offset)
      put64(b, entry + 24, foundry::hash64(b->data() + offset, static_cast<size_t>(size)));
  }
  put64(b, 24, foundry::hash64(b->data() + 64, static_cast<size_t>(count) * 32));
  put64(b, 32, foundry::hash64(b->data(), 32));
}

}  // namespace foundry_fuzz
