// The deterministic device-memory region: one fixed virtual range reserved at a chosen address,
// inside which allocations get addresses that depend only on the sequence of requests.
//
// One region per process, bound to the device whose context was current when it was set;
// allocations made with another device current take the normal driver path. All state is behind
// one mutex: the order of requests from all threads is the order of the log.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "region/alloc_log.h"
#include "region/va_space.h"
#include "region/word_class.h"

namespace foundry {

struct RegionInfo {
  uint64_t base = 0;
  uint64_t size = 0;
  bool set = false;
  bool active = false;
  uint64_t cursor = 0;
  uint64_t high_water = 0;
  uint64_t live_bytes = 0;
  uint64_t live_count = 0;
};

enum class AddressClass { kOutside = 0, kLive = 1, kInsideNotLive = 2 };

class Region {
 public:
  static Region& instance();

  Status set(uint64_t base, uint64_t size);
  Status release();
  Status stop();
  Status resume();
  RegionInfo info();

  // True when allocations made now (on the calling thread's device) belong to the region.
  bool accepts_allocations();
  // True when ptr is the start of a region block (so frees must come here).
  bool owns(uint64_t ptr);
  bool owns_reservation(uint64_t ptr);

  Result<uint64_t> alloc(uint64_t size);
  Status free(uint64_t ptr);
  Result<uint64_t> reserve(uint64_t size, uint64_t alignment);
  Status unreserve(uint64_t ptr, uint64_t size);
  Status claim(uint64_t offset, uint64_t size, bool* mapped);
  Status set_offset(uint64_t offset);
  uint64_t offset();
  Status preallocate(uint64_t size);
  Status free_preallocated();
  // Records an allocation that went around the region (a fallback in non-strict mode).
  void note_outside(uint64_t size);

  AddressClass classify(uint64_t addr, Block* block);
  // The pointer audit's view of a graph's word (see word_class.h); kOutside when no region is set.
  WordClass classify_word(uint64_t value, Block* block);
  // The allocation log's account of an address in the region (see AllocLog::describe_offset).
  std::string history(uint64_t addr);
  uint64_t driver_calls();

  // Log access (under the region's lock).
  uint32_t set_tag(const std::string& tag);
  std::vector<foundry_log_entry> log_entries(uint64_t first, uint64_t max);
  uint64_t log_size();
  std::string log_tag(uint32_t index);
  void expect(std::vector<foundry_log_entry> expected);
  bool divergence(foundry_log_entry* expected, foundry_log_entry* actual);

 private:
  struct Mapping {
    uint64_t offset;
    uint64_t size;
    CUmemGenericAllocationHandle handle;
  };

  Status map_range(uint64_t offset, uint64_t size, std::vector<Mapping>* out);
  Status unmap(std::vector<Mapping>* mappings, bool synchronize);
  Status map_uncovered(uint64_t offset, uint64_t size, std::vector<Mapping>* out);
  Status record(LogKind kind, uint64_t offset, uint64_t size);
  bool device_matches();

  std::mutex mu_;
  bool set_ = false;
  bool active_ = false;
  uint64_t base_ = 0;
  CUdevice device_ = 0;
  VaSpace va_;
  AllocLog log_;
  std::map<uint64_t, std::vector<Mapping>> owned_;  // block offset -> its own mappings
  std::vector<Mapping> prealloc_;                    // preallocated chunks, sorted by offset
  uint64_t driver_calls_ = 0;
};

}  // namespace foundry
