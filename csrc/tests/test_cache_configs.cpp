// CacheConfigLog: the cache preferences the process set, as SAVE reads them (the driver cannot be
// asked). Handles are opaque keys here, so fake ones stand in for the driver's.
#include <cstdint>

#include "graph/model.h"
#include "modules/cache_configs.h"
#include "tests/check.h"

using namespace foundry;

namespace {

template <typename T>
T fake(uintptr_t v) { return reinterpret_cast<T>(v); }

}  // namespace

TEST_CASE("a function without a recorded preference has the driver's default") {
  CacheConfigLog& log = CacheConfigLog::instance();
  CHECK_EQ(log.get(fake<CUfunction>(0x1000), nullptr, 0), kCachePreferNone);
  CHECK_EQ(log.get(nullptr, fake<CUkernel>(0x2000), 0), kCachePreferNone);
  CHECK_EQ(log.get(nullptr, nullptr, 0), kCachePreferNone);
}

TEST_CASE("the most recent preference set on a function is the one read") {
  CacheConfigLog& log = CacheConfigLog::instance();
  CUfunction f = fake<CUfunction>(0x1100);
  CUmodule m = fake<CUmodule>(0x9100);
  log.note_function(f, m, kCachePreferL1);
  CHECK_EQ(log.get(f, nullptr, 0), kCachePreferL1);
  log.note_function(f, m, kCachePreferShared);
  CHECK_EQ(log.get(f, nullptr, 0), kCachePreferShared);
  log.note_function(f, m, kCachePreferNone);  // set back to the default
  CHECK_EQ(log.get(f, nullptr, 0), kCachePreferNone);
  log.note_function(nullptr, m, kCachePreferShared);  // ignored
  CHECK_EQ(log.get(nullptr, nullptr, 0), kCachePreferNone);
}

TEST_CASE("a note without an owner, or with a value that is not a CUfunc_cache, is not recorded") {
  CacheConfigLog& log = CacheConfigLog::instance();
  CUfunction f = fake<CUfunction>(0x1180);
  CUmodule m = fake<CUmodule>(0x9180);
  log.note_function(f, nullptr, kCachePreferShared);  // nothing would forget it at an unload
  CHECK_EQ(log.get(f, nullptr, 0), kCachePreferNone);
  log.note_function(f, m, 7);
  log.note_function(f, m, -1);
  CHECK_EQ(log.get(f, nullptr, 0), kCachePreferNone);
  CUkernel k = fake<CUkernel>(0x2180);
  log.note_kernel(k, 0, nullptr, kCachePreferShared);
  log.note_kernel(k, 0, fake<CUlibrary>(0x8180), 4);
  CHECK_EQ(log.get(nullptr, k, 0), kCachePreferNone);
}

TEST_CASE("a kernel's preference is per device, and the function's own one wins") {
  CacheConfigLog& log = CacheConfigLog::instance();
  CUkernel k = fake<CUkernel>(0x2200);
  CUlibrary lib = fake<CUlibrary>(0x9200);
  log.note_kernel(k, 0, lib, kCachePreferShared);
  CHECK_EQ(log.get(nullptr, k, 0), kCachePreferShared);
  CHECK_EQ(log.get(nullptr, k, 1), kCachePreferNone);
  CUfunction f = fake<CUfunction>(0x1200);
  CHECK_EQ(log.get(f, k, 0), kCachePreferShared);  // nothing on the function: the kernel's
  log.note_function(f, fake<CUmodule>(0x9201), kCachePreferEqual);
  CHECK_EQ(log.get(f, k, 0), kCachePreferEqual);
}

TEST_CASE("unloading a module or library forgets its handles, which the driver may reuse") {
  CacheConfigLog& log = CacheConfigLog::instance();
  CUmodule m = fake<CUmodule>(0x9300);
  CUfunction a = fake<CUfunction>(0x1300), b = fake<CUfunction>(0x1301), other = fake<CUfunction>(0x1302);
  log.note_function(a, m, kCachePreferShared);
  log.note_function(b, m, kCachePreferL1);
  log.note_function(other, fake<CUmodule>(0x9301), kCachePreferShared);
  CUkernel k = fake<CUkernel>(0x2300);
  CUlibrary lib = fake<CUlibrary>(0x9302);
  log.note_kernel(k, 0, lib, kCachePreferL1);
  log.forget_owner(m);
  CHECK_EQ(log.get(a, nullptr, 0), kCachePreferNone);
  CHECK_EQ(log.get(b, nullptr, 0), kCachePreferNone);
  CHECK_EQ(log.get(other, nullptr, 0), kCachePreferShared);
  CHECK_EQ(log.get(nullptr, k, 0), kCachePreferL1);
  log.forget_owner(lib);
  CHECK_EQ(log.get(nullptr, k, 0), kCachePreferNone);
  log.forget_owner(nullptr);  // an unknown owner: nothing happens
  CHECK_EQ(log.get(other, nullptr, 0), kCachePreferShared);
}

TEST_MAIN()
