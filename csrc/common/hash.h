// 64-bit content hashing (XXH64). Image identities, archive checksums and fingerprints all use it,
// so results must match the reference xxhash library bit for bit (files written by one build are
// verified by another, and by Python through the `xxhash` package).
#pragma once

#include <cstddef>
#include <cstdint>

namespace foundry {

// One-shot XXH64 of `size` bytes at `data` (data may be null when size is 0).
uint64_t hash64(const void* data, size_t size, uint64_t seed = 0);

// Streaming XXH64: any sequence of update() calls yields the same digest as one hash64() call
// over the concatenated bytes.
class Hasher64 {
 public:
  explicit Hasher64(uint64_t seed = 0) { reset(seed); }

  void reset(uint64_t seed = 0);
  void update(const void* data, size_t size);
  // The digest of everything added so far; does not change the state (more updates may follow).
  uint64_t digest() const;

 private:
  uint64_t lanes_[4];
  uint64_t seed_;
  uint64_t total_ = 0;      // bytes added so far
  uint8_t pending_[32];     // a partial 32-byte stripe not yet folded into the lanes
  size_t pending_size_ = 0;
};

}  // namespace foundry
