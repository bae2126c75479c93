// SAVE's pointer audit rule: what a graph's pointer-sized word is against the region's state.
// The region here is the bookkeeping alone (live blocks and history), driven as an application
// would drive it; the case from ATen's cat kernel is a 64 MiB temporary freed before capture
// whose address stays in an unused slot of the kernel's by-value metadata struct.
#include "region/word_class.h"

#include "tests/check.h"

using foundry::AllocLog;
using foundry::Block;
using foundry::BlockKind;
using foundry::classify_word;
using foundry::LogKind;
using foundry::VaSpace;
using foundry::WordClass;

namespace {
constexpr uint64_t kBase = 0x500000000000ull;
constexpr uint64_t kG = 2 << 20;

// A region that allocated `size` bytes (logged), optionally freed again.
struct Region {
  VaSpace va;
  AllocLog log;
  Region() { va.reset(1ull << 36, kG); }
  uint64_t alloc(uint64_t size, BlockKind kind = BlockKind::kAlloc) {
    uint64_t off = va.allocate(size, 0, kind).value();
    log.append(kind == BlockKind::kReserve ? LogKind::kReserve : LogKind::kAlloc, off, va.round_up(size));
    return kBase + off;
  }
  void free(uint64_t addr) {
    Block b = va.release(addr - kBase).value();
    log.append(LogKind::kFree, b.offset, b.size);
  }
  WordClass classify(uint64_t word, Block* b = nullptr) const { return classify_word(word, kBase, va, log, b); }
};
}  // namespace

TEST_CASE("small and non-canonical words are scalars, whatever the region") {
  Region r;
  CHECK(r.classify(0) == WordClass::kScalar);
  CHECK(r.classify(100 * 100) == WordClass::kScalar);
  CHECK(r.classify(0xffffffffull) == WordClass::kScalar);
  CHECK(r.classify(1ull << 48) == WordClass::kScalar);
  CHECK(r.classify(0xffff800000000000ull) == WordClass::kScalar);
}

TEST_CASE("a word inside a live block is a pointer, and names its block") {
  Region r;
  r.alloc(4 << 20);
  uint64_t b = r.alloc(1 << 20);
  Block got;
  CHECK(r.classify(b + 4096, &got) == WordClass::kLive);
  CHECK_EQ(got.offset, b - kBase);
  CHECK_EQ(got.size, kG);
}

TEST_CASE("a reservation counts as live: its mappings are the application's") {
  Region r;
  uint64_t v = r.alloc(64 << 20, BlockKind::kReserve);
  CHECK(r.classify(v + (8 << 20)) == WordClass::kLive);
}

TEST_CASE("the stale slot of a cat kernel's metadata: a temporary freed before capture") {
  Region r;
  r.alloc(2 << 20);                  // inputs
  uint64_t tmp = r.alloc(64 << 20);  // a 64 MiB temporary of the warm-up
  r.free(tmp);                       // empty_cache before capture
  CHECK(r.classify(tmp + 0xa00000) == WordClass::kFreed);
}

TEST_CASE("freed space reused by a later allocation is live again") {
  Region r;
  uint64_t tmp = r.alloc(64 << 20);
  r.free(tmp);
  uint64_t again = r.alloc(8 << 20);  // first fit: the freed hole
  CHECK_EQ(again, tmp);
  CHECK(r.classify(tmp + 4096) == WordClass::kLive);
  CHECK(r.classify(tmp + (32 << 20)) == WordClass::kFreed);  // the rest of the hole stays freed
}

TEST_CASE("region space nothing ever occupied holds look-alike values") {
  Region r;
  r.alloc(2 << 20);
  // (1073741824, 20480) as two 32-bit fields reads as 0x500040000000: in this region, beyond
  // everything it ever handed out.
  uint64_t pair = (20480ull << 32) | 1073741824ull;
  CHECK(r.classify(pair) == WordClass::kNeverCovered);
  CHECK(r.classify((20480ull << 32) | 8192) == WordClass::kLive);  // the same shape inside the first block
}

TEST_CASE("words outside the region, or with no region, are left to the driver") {
  Region r;
  r.alloc(2 << 20);
  CHECK(r.classify(kBase - 4096) == WordClass::kOutside);
  CHECK(r.classify(kBase + (1ull << 36)) == WordClass::kOutside);
  CHECK(classify_word(kBase + 4096, 0, r.va, r.log, nullptr) == WordClass::kOutside);
}

TEST_MAIN()
