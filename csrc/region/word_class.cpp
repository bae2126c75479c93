#include "region/word_class.h"

namespace foundry {

const char* word_class_name(WordClass c) {
  switch (c) {
    case WordClass::kScalar: return "scalar";
    case WordClass::kLive: return "live region pointer";
    case WordClass::kNeverCovered: return "look-alike value";
    case WordClass::kFreed: return "freed region address";
    case WordClass::kOutside: return "outside the region";
  }
  return "unknown";
}

WordClass classify_word(uint64_t value, uint64_t base, const VaSpace& va, const AllocLog& log, Block* block) {
  // Device addresses are canonical 48-bit user-space addresses above 4 GiB on every supported
  // platform; anything else is a count, a size or a pair of small 32-bit fields.
  if (value < (1ull << 32) || value >= (1ull << 48)) return WordClass::kScalar;
  if (base == 0 || value < base || value - base >= va.size()) return WordClass::kOutside;
  uint64_t offset = value - base;
  if (const Block* b = va.find(offset)) {
    if (block) *block = *b;
    return WordClass::kLive;
  }
  return log.ever_covered(offset) ? WordClass::kFreed : WordClass::kNeverCovered;
}

}  // namespace foundry
