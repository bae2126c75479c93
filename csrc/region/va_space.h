// Address bookkeeping of a region, with no driver calls: which offsets are live, which are free
// for reuse, where the cursor stands. Kept apart from the mapping code so that its determinism
// (same request sequence -> same offsets) is unit-tested without a GPU.
//
// Policy: first fit among freed holes above the seal, else bump at the cursor. Reusing freed
// space keeps the region small even when the application frees and re-allocates (empty_cache),
// and stays deterministic because the choice depends only on the sequence of requests.
#pragma once

#include <cstdint>
#include <map>

#include "common/status.h"

namespace foundry {

enum class BlockKind : uint32_t { kAlloc = 0, kReserve = 1, kClaim = 2 };

struct Block {
  uint64_t offset = 0;
  uint64_t size = 0;
  BlockKind kind = BlockKind::kAlloc;
};

class VaSpace {
 public:
  void reset(uint64_t size, uint64_t granularity);

  uint64_t granularity() const { return granularity_; }
  uint64_t round_up(uint64_t n) const { return (n + granularity_ - 1) / granularity_ * granularity_; }

  // Picks offsets for `size` bytes aligned to `alignment` (a multiple of the granularity).
  Result<uint64_t> allocate(uint64_t size, uint64_t alignment, BlockKind kind);
  // Frees the block that starts exactly at `offset`.
  Result<Block> release(uint64_t offset);
  // Marks [offset, offset+size) live. OK when it is free; *existing = true (and nothing changes)
  // when exactly one live block has that range; an error when it overlaps anything else.
  Status claim(uint64_t offset, uint64_t size, bool* existing);
  // Moves the cursor to `offset` (never backwards) and forgets freed holes below it.
  Status seal(uint64_t offset);

  // The live block containing `offset`, or nullptr.
  const Block* find(uint64_t offset) const;
  const std::map<uint64_t, Block>& live() const { return live_; }
  uint64_t cursor() const { return cursor_; }
  uint64_t high_water() const { return high_water_; }
  uint64_t live_bytes() const { return live_bytes_; }
  uint64_t size() const { return size_; }

 private:
  void add_hole(uint64_t offset, uint64_t size);
  void carve_hole(uint64_t offset, uint64_t size);

  uint64_t size_ = 0;
  uint64_t granularity_ = 1;
  uint64_t cursor_ = 0;      // everything at or above is untouched
  uint64_t seal_ = 0;        // freed space below is never handed out again
  uint64_t high_water_ = 0;  // highest end ever live
  uint64_t live_bytes_ = 0;
  std::map<uint64_t, Block> live_;      // by offset
  std::map<uint64_t, uint64_t> holes_;  // offset -> size, between seal_ and cursor_
};

}  // namespace foundry
