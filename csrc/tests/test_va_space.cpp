// Region address bookkeeping: determinism, reuse of freed space, seals, claims, exhaustion.
#include "region/va_space.h"

#include <vector>

#include "tests/check.h"

using foundry::BlockKind;
using foundry::VaSpace;

namespace {
constexpr uint64_t kG = 2 << 20;  // 2 MiB granularity

std::vector<uint64_t> run_sequence(VaSpace& va) {
  std::vector<uint64_t> out;
  auto a = va.allocate(5 << 20, 0, BlockKind::kAlloc);
  auto b = va.allocate(1, 0, BlockKind::kAlloc);
  va.release(a.value());
  auto c = va.allocate(3 << 20, 0, BlockKind::kAlloc);  // reuses a's hole
  auto d = va.allocate(64 << 20, 0, BlockKind::kReserve);
  out = {a.value(), b.value(), c.value(), d.value()};
  return out;
}
}  // namespace

TEST_CASE("same request sequence gives the same offsets") {
  VaSpace x, y;
  x.reset(1ull << 34, kG);
  y.reset(1ull << 34, kG);
  CHECK(run_sequence(x) == run_sequence(y));
}

TEST_CASE("freed space is reused first fit") {
  VaSpace va;
  va.reset(1ull << 34, kG);
  auto a = va.allocate(6 << 20, 0, BlockKind::kAlloc).value();
  auto b = va.allocate(2 << 20, 0, BlockKind::kAlloc).value();
  CHECK_EQ(a, 0u);
  CHECK_EQ(b, 6u << 20);
  CHECK(va.release(a).ok());
  auto c = va.allocate(4 << 20, 0, BlockKind::kAlloc).value();
  CHECK_EQ(c, 0u);
  auto d = va.allocate(2 << 20, 0, BlockKind::kAlloc).value();
  CHECK_EQ(d, 4u << 20);
  CHECK_EQ(va.cursor(), 8u << 20);
}

TEST_CASE("sizes round up to the granularity and alignment is honoured") {
  VaSpace va;
  va.reset(1ull << 34, kG);
  CHECK_EQ(va.allocate(1, 0, BlockKind::kAlloc).value(), 0u);
  auto r = va.allocate(kG, 8 * kG, BlockKind::kReserve).value();
  CHECK_EQ(r % (8 * kG), 0u);
  CHECK_EQ(va.live_bytes(), 2 * kG);
}

TEST_CASE("seal moves forward only and forgets holes below") {
  VaSpace va;
  va.reset(1ull << 34, kG);
  auto a = va.allocate(kG, 0, BlockKind::kAlloc).value();
  va.allocate(kG, 0, BlockKind::kAlloc);
  va.release(a);
  CHECK(!va.seal(kG).ok());  // backwards past a live block
  CHECK(va.seal(64 << 20).ok());
  CHECK_EQ(va.allocate(kG, 0, BlockKind::kAlloc).value(), uint64_t(64 << 20));  // the hole at 0 is not reused
}

TEST_CASE("exhaustion is an error naming sizes") {
  VaSpace va;
  va.reset(8 * kG, kG);
  CHECK(va.allocate(6 * kG, 0, BlockKind::kAlloc).ok());
  auto r = va.allocate(4 * kG, 0, BlockKind::kAlloc);
  CHECK(!r.ok());
  CHECK_EQ(r.status().code(), FOUNDRY_ERR_REGION_EXHAUSTED);
}

TEST_CASE("claims: free range, identical live block, and overlap") {
  VaSpace va;
  va.reset(1ull << 34, kG);
  bool existing = false;
  CHECK(va.claim(10 * kG, 2 * kG, &existing).ok());
  CHECK(!existing);
  CHECK_EQ(va.cursor(), 12 * kG);
  // Allocations skip the claimed range; the gap below it is reused.
  CHECK_EQ(va.allocate(kG, 0, BlockKind::kAlloc).value(), 0u);
  CHECK(va.claim(10 * kG, 2 * kG, &existing).ok());
  CHECK(existing);
  auto overlap = va.claim(11 * kG, 2 * kG, &existing);
  CHECK_EQ(overlap.code(), FOUNDRY_ERR_DIVERGENCE);
  CHECK(!va.claim(3, kG, &existing).ok());  // not aligned
}

TEST_CASE("find locates the containing block") {
  VaSpace va;
  va.reset(1ull << 34, kG);
  auto a = va.allocate(4 * kG, 0, BlockKind::kAlloc).value();
  CHECK(va.find(a + kG + 17) != nullptr);
  CHECK(va.find(a + 4 * kG) == nullptr);
  CHECK(!va.release(a + kG).ok());  // not the start of a block
}

TEST_MAIN()
