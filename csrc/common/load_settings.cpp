#include "common/load_settings.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace foundry {
namespace {

std::atomic<bool>& map_slot() {
  static std::atomic<bool> map{[] {
    const char* v = std::getenv("FOUNDRY_READ_MAP");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }()};
  return map;
}

std::atomic<size_t>& threads_slot() {
  static std::atomic<size_t> threads{[] {
    const char* v = std::getenv("FOUNDRY_IMAGE_THREADS");
    if (v == nullptr || *v == '\0') return size_t{0};
    char* end = nullptr;
    unsigned long n = std::strtoul(v, &end, 10);
    if (*end != '\0') {
      LOG_WARNING("FOUNDRY_IMAGE_THREADS=%s is not a number of threads; using the default", v);
      return size_t{0};
    }
    return static_cast<size_t>(n);
  }()};
  return threads;
}

std::atomic<bool>& priority_slot() {
  static std::atomic<bool> use{[] {
    const char* v = std::getenv("FOUNDRY_NODE_PRIORITY");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }()};
  return use;
}

// Read now, while the library is loaded. (FOUNDRY_STRICT and FOUNDRY_LOG stay read at their
// first use: an engine plugin sets FOUNDRY_STRICT in a process that already has the library.)
__attribute__((constructor)) void read_settings_at_load() {
  map_slot();
  threads_slot();
  priority_slot();
}

}  // namespace

bool map_archive_files() { return map_slot().load(); }
void set_map_archive_files(bool map) { map_slot().store(map); }
size_t image_threads_setting() { return threads_slot().load(); }
void set_image_threads_setting(size_t threads) { threads_slot().store(threads); }
bool use_node_priority() { return priority_slot().load(); }
void set_use_node_priority(bool use) { priority_slot().store(use); }

}  // namespace foundry
