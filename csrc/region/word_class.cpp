#include "region/word_class.h"

namespace foundry {

WordClass classify_word(uint64_t value, uint64_t base, const VaSpace& va, const AllocLog& log, Block* block) {
  if (is_scalar_word(value)) return WordClass::kScalar;
  if (base == 0 || value < base || value - base >= va.size()) return WordClass::kOutside;
  uint64_t offset = value - base;
  if (const Block* b = va.find(offset)) {
    if (block) *block = *b;
    return WordClass::kLive;
  }
  return log.ever_covered(offset) ? WordClass::kFreed : WordClass::kNeverCovered;
}

}  // namespace foundry
