#include "common/strict.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace foundry {
namespace {
std::atomic<bool>& slot() {
  static std::atomic<bool> strict{[] {
    const char* v = std::getenv("FOUNDRY_STRICT");
    return v != nullptr && std::strcmp(v, "0") != 0 && std::strcmp(v, "") != 0;
  }()};
  return strict;
}
}  // namespace

bool strict_mode() { return slot().load(); }
void set_strict_mode(bool strict) { slot().store(strict); }
}  // namespace foundry
