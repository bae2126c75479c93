// The allocation log: every region event in order, with a sequence number. SAVE stores it; LOAD
// installs it as the expectation and learns of the first divergence as it happens.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "capi/foundry.h"

namespace foundry {

enum class LogKind : uint32_t {
  kAlloc = 0,
  kFree = 1,
  kReserve = 2,
  kUnreserve = 3,
  kOutside = 4,  // an allocation that went around the region (fallback)
  kSeal = 5,     // set_current_alloc_offset
  kPrealloc = 6,
  kClaim = 7,
};

const char* log_kind_name(uint32_t kind);

class AllocLog {
 public:
  // Appends an event; returns false when it diverges from the expected log (the first
  // divergence is kept).
  bool append(LogKind kind, uint64_t offset, uint64_t size);
  void reset();

  uint32_t set_tag(const std::string& tag);
  std::string tag(uint32_t index) const;

  uint64_t size() const { return entries_.size(); }
  const std::vector<foundry_log_entry>& entries() const { return entries_; }

  void expect(std::vector<foundry_log_entry> expected);
  bool diverged() const { return diverged_; }
  const foundry_log_entry& divergence_expected() const { return div_expected_; }
  const foundry_log_entry& divergence_actual() const { return div_actual_; }
  std::string describe_divergence() const;
  // What the log knows about region offset `offset`: the last event whose range covers it (its
  // kind, sequence number, size and tag) and, for an allocation, the free that ended it. For
  // messages about stale pointers: "allocated at seq 12 (2097152 bytes, tag 'x'), freed at seq 40".
  std::string describe_offset(uint64_t offset) const;
  // Whether any allocation, reservation, preallocation or claim ever covered `offset`. A word
  // pointing at region space nothing ever covered cannot be a pointer the process dereferenced.
  bool ever_covered(uint64_t offset) const;

 private:
  std::vector<foundry_log_entry> entries_;
  std::vector<std::string> tags_{""};
  uint32_t current_tag_ = 0;
  std::vector<foundry_log_entry> expected_;
  bool expecting_ = false;
  bool diverged_ = false;
  foundry_log_entry div_expected_{};
  foundry_log_entry div_actual_{};
};

}  // namespace foundry
