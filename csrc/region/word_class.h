// What a pointer-sized word found in a captured graph is, judged against the region at SAVE.
// A pure function of the region's bookkeeping (live blocks and history), so that the rule SAVE's
// pointer audit follows is unit-tested without a GPU.
#pragma once

#include <cstdint>

#include "region/alloc_log.h"
#include "region/va_space.h"

namespace foundry {

enum class WordClass {
  kScalar,        // too small or non-canonical to be a device address
  kLive,          // inside a live region block or reservation: a pointer LOAD reproduces
  kNeverCovered,  // region space nothing ever occupied: a value that looks like an address
  kFreed,         // region space that was occupied and is free now: a stale value or a dangling pointer
  kOutside,       // outside the region: only the driver can say whether it is device memory
};

// Device addresses are canonical 48-bit user-space addresses above 4 GiB on every supported
// platform; anything else is a count, a size or a pair of small 32-bit fields. Inline and
// lock-free: SAVE asks it of millions of words before it asks the region about the rest.
inline bool is_scalar_word(uint64_t value) { return value < (1ull << 32) || value >= (1ull << 48); }

// `base` is the region's address (0: no region, every address is outside); `va` its live blocks
// and `log` its history. *block receives the live block for kLive.
WordClass classify_word(uint64_t value, uint64_t base, const VaSpace& va, const AllocLog& log, Block* block);

}  // namespace foundry
