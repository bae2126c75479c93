// The allocation log's account of an address: what covered it last, and when that was freed.
#include "region/alloc_log.h"

#include <string>

#include "tests/check.h"

using foundry::AllocLog;
using foundry::LogKind;

namespace {
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("a freed block is named with its allocation and its free") {
  AllocLog log;
  log.set_tag("init");
  log.append(LogKind::kAlloc, 0, 4096);
  log.append(LogKind::kAlloc, 4096, 8192);
  log.set_tag("profile");
  log.append(LogKind::kFree, 4096, 8192);
  std::string text = log.describe_offset(4096 + 100);
  CHECK(contains(text, "seq 1"));
  CHECK(contains(text, "8192 bytes"));
  CHECK(contains(text, "tag 'init'"));
  CHECK(contains(text, "freed at seq 2 (tag 'profile')"));
}

TEST_CASE("the newest covering event wins; a live block has no free") {
  AllocLog log;
  log.append(LogKind::kAlloc, 0, 4096);
  log.append(LogKind::kFree, 0, 4096);
  log.append(LogKind::kAlloc, 0, 2048);
  std::string text = log.describe_offset(10);
  CHECK(contains(text, "seq 2"));
  CHECK(!contains(text, "freed"));
}

TEST_CASE("an address no event covered says so") {
  AllocLog log;
  log.append(LogKind::kAlloc, 0, 4096);
  CHECK(contains(log.describe_offset(1 << 20), "no region event ever covered it"));
}

TEST_CASE("ever_covered: allocated space stays covered after its free; untouched space never was") {
  AllocLog log;
  log.append(LogKind::kAlloc, 1 << 20, 4096);
  log.append(LogKind::kFree, 1 << 20, 4096);
  log.append(LogKind::kReserve, 8 << 20, 2 << 20);
  CHECK(log.ever_covered((1 << 20) + 100));
  CHECK(log.ever_covered((8 << 20) + 4096));
  CHECK(!log.ever_covered(0x2000));  // the (8192, 24576) word of a cuBLAS parameter struct
  CHECK(!log.ever_covered((1 << 20) + 4096));
}

TEST_MAIN()
