// libFuzzer target for Container::parse (built by scripts/build-fuzz; not a ctest).
//
// Each input is parsed twice: as given, and after "resealing" it (recomputing every checksum the
// layout lets us find). The raw pass covers the header checks; a fuzzer cannot forge 64-bit
// hashes, so without the resealed pass it would never get past the checksums to the table,
// layout and padding checks behind them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "archive/container.h"
#include "common/hash.h"

namespace {

uint64_t get_le(const std::vector<uint8_t>& b, size_t at, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
  return v;
}

void put64(std::vector<uint8_t>* b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*b)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// Fixes section checksums (where the section lies inside the buffer), then the table checksum,
// then the header checksum, in that order because each covers the previous.
void reseal(std::vector<uint8_t>* b) {
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

void parse_and_touch(std::vector<uint8_t> bytes) {
  foundry::Result<foundry::Container> r = foundry::Container::parse(std::move(bytes), "fuzz");
  if (!r.ok()) return;
  // A container that validates must be safe to read in full.
  const foundry::Container& c = r.value();
  volatile uint64_t sink = 0;
  for (const foundry::Section& s : c) {
    foundry::ByteSpan span = c.data(s);
    if (span.size != s.size) __builtin_trap();
    for (uint8_t byte : span) sink = sink + byte;
    foundry::Result<foundry::ByteReader> rd = c.reader(s.type);
    if (!rd.ok()) __builtin_trap();
    uint64_t v;
    while (rd.value().u64(&v)) sink = sink ^ v;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  parse_and_touch(bytes);
  reseal(&bytes);
  parse_and_touch(std::move(bytes));
  return 0;
}
