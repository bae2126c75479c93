// C boundary: the kernel-image registry.
#include <cstring>
#include <string>
#include <vector>

#include "capi/errors.h"
#include "capi/foundry.h"
#include "modules/cache_configs.h"
#include "modules/registry.h"

using namespace foundry;

namespace {

foundry_status copy_out(const std::string& s, char* buf, size_t len) {
  if (buf == nullptr || len == 0) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "output buffer is empty"));
  if (s.size() + 1 > len) {
    return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "output buffer of " + std::to_string(len) + " bytes is too small for " +
                                                          std::to_string(s.size() + 1)));
  }
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return FOUNDRY_OK;
}

}  // namespace

extern "C" {

foundry_status foundry_images_count(uint64_t* count) {
  if (count == nullptr) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "count is NULL"));
  *count = Registry::instance().count();
  return FOUNDRY_OK;
}

foundry_status foundry_images_get(uint64_t index, foundry_image_record* out) {
  if (out == nullptr) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "out is NULL"));
  return report(Registry::instance().record_at(index, out));
}

foundry_status foundry_image_entry_name(uint64_t hash, uint32_t i, char* buf, size_t buf_len) {
  auto name = Registry::instance().entry_name(hash, i);
  if (!name.ok()) return report(name.status());
  return copy_out(name.value(), buf, buf_len);
}

foundry_status foundry_function_lookup(uint64_t handle, uint64_t* image_hash, char* name, size_t name_len) {
  if (image_hash == nullptr) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "image_hash is NULL"));
  std::string n;
  uint64_t h = 0;
  Status s = Registry::instance().lookup(reinterpret_cast<CUfunction>(handle), nullptr, &h, &n);
  if (!s.ok()) return report(s);
  *image_hash = h;
  return copy_out(n, name, name_len);
}

foundry_status foundry_images_pack(const char* dir, const uint64_t* hashes, uint64_t count, int arch) {
  if (dir == nullptr || (hashes == nullptr && count)) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "dir or hashes is NULL"));
  return report(Registry::instance().pack(dir, std::vector<uint64_t>(hashes, hashes + count), arch));
}

static foundry_status load_images(const char* dir, bool lazy, uint64_t* loaded) {
  if (dir == nullptr) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "dir is NULL"));
  auto n = Registry::instance().load_dir(dir, lazy);
  if (!n.ok()) return report(n.status());
  if (loaded) *loaded = n.value();
  return FOUNDRY_OK;
}

foundry_status foundry_images_load(const char* dir, uint64_t* loaded) { return load_images(dir, false, loaded); }

foundry_status foundry_images_load_lazy(const char* dir, uint64_t* loaded) { return load_images(dir, true, loaded); }

foundry_status foundry_function_resolve(uint64_t image_hash, const char* name, uint64_t* func) {
  if (name == nullptr || func == nullptr) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "name or func is NULL"));
  auto f = Registry::instance().resolve(image_hash, name);
  if (!f.ok()) return report(f.status());
  *func = reinterpret_cast<uint64_t>(f.value());
  return FOUNDRY_OK;
}

foundry_status foundry_function_cache_config(uint64_t func, int32_t* config) {
  if (config == nullptr) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "config is NULL"));
  *config = CacheConfigLog::instance().get(reinterpret_cast<CUfunction>(func), nullptr, 0);
  return FOUNDRY_OK;
}

foundry_status foundry_images_init_nvshmem(uint64_t* initialised) {
  auto n = Registry::instance().init_nvshmem();
  if (!n.ok()) return report(n.status());
  if (initialised) *initialised = n.value();
  return FOUNDRY_OK;
}

}  // extern "C"
