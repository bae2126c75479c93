// libFuzzer target for Container::parse (built by scripts/build-fuzz; not a ctest).
//
// Each input is parsed twice: as given (the header and checksum checks), and resealed (reseal.h:
// the table, layout and padding checks behind the checksums).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "archive/container.h"
#include "tests/fuzz/reseal.h"

namespace {

using foundry_fuzz::reseal;

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
