// C boundary: the deterministic region and its allocation log.
#include <cstring>
#include <vector>

#include "capi/errors.h"
#include "capi/foundry.h"
#include "region/region.h"

using namespace foundry;

namespace {
Status null_arg(const char* what) { return Error(FOUNDRY_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL"); }
}  // namespace

extern "C" {

foundry_status foundry_region_set(uint64_t base, uint64_t size) { return report(Region::instance().set(base, size)); }
foundry_status foundry_region_release(void) { return report(Region::instance().release()); }
foundry_status foundry_region_stop(void) { return report(Region::instance().stop()); }
foundry_status foundry_region_resume(void) { return report(Region::instance().resume()); }

foundry_status foundry_region_info(uint64_t* base, uint64_t* size, int* active, uint64_t* cursor_offset,
                                   uint64_t* high_water_offset, uint64_t* live_bytes, uint64_t* live_count) {
  RegionInfo i = Region::instance().info();
  if (!i.set) return report(Error(FOUNDRY_ERR_STATE, "no allocation region is set"));
  if (base) *base = i.base;
  if (size) *size = i.size;
  if (active) *active = i.active ? 1 : 0;
  if (cursor_offset) *cursor_offset = i.cursor;
  if (high_water_offset) *high_water_offset = i.high_water;
  if (live_bytes) *live_bytes = i.live_bytes;
  if (live_count) *live_count = i.live_count;
  return FOUNDRY_OK;
}

foundry_status foundry_region_get_offset(uint64_t* offset) {
  if (offset == nullptr) return report(null_arg("offset"));
  if (!Region::instance().info().set) return report(Error(FOUNDRY_ERR_STATE, "no allocation region is set"));
  *offset = Region::instance().offset();
  return FOUNDRY_OK;
}

foundry_status foundry_region_set_offset(uint64_t offset) { return report(Region::instance().set_offset(offset)); }
foundry_status foundry_region_preallocate(uint64_t size) { return report(Region::instance().preallocate(size)); }
foundry_status foundry_region_free_preallocated(void) { return report(Region::instance().free_preallocated()); }

foundry_status foundry_region_alloc(uint64_t size, uint64_t* ptr) {
  if (ptr == nullptr) return report(null_arg("ptr"));
  auto r = Region::instance().alloc(size);
  if (!r.ok()) return report(r.status());
  *ptr = r.value();
  return FOUNDRY_OK;
}

foundry_status foundry_region_free(uint64_t ptr) { return report(Region::instance().free(ptr)); }

foundry_status foundry_region_claim(uint64_t offset, uint64_t size, int* mapped) {
  bool m = false;
  Status s = Region::instance().claim(offset, size, &m);
  if (s.ok() && mapped) *mapped = m ? 1 : 0;
  return report(s);
}

foundry_status foundry_region_classify(uint64_t addr, int* kind, uint64_t* alloc_offset, uint64_t* alloc_size) {
  if (kind == nullptr) return report(null_arg("kind"));
  Block b;
  AddressClass c = Region::instance().classify(addr, &b);
  *kind = static_cast<int>(c);
  if (c == AddressClass::kLive) {
    if (alloc_offset) *alloc_offset = b.offset;
    if (alloc_size) *alloc_size = b.size;
  }
  return FOUNDRY_OK;
}

foundry_status foundry_region_driver_calls(uint64_t* calls) {
  if (calls == nullptr) return report(null_arg("calls"));
  *calls = Region::instance().driver_calls();
  return FOUNDRY_OK;
}

foundry_status foundry_region_set_tag(const char* tag, uint32_t* index) {
  uint32_t i = Region::instance().set_tag(tag ? tag : "");
  if (index) *index = i;
  return FOUNDRY_OK;
}

foundry_status foundry_region_log_size(uint64_t* count) {
  if (count == nullptr) return report(null_arg("count"));
  *count = Region::instance().log_size();
  return FOUNDRY_OK;
}

foundry_status foundry_region_log_read(uint64_t first, foundry_log_entry* out, uint64_t capacity, uint64_t* written) {
  if (out == nullptr && capacity) return report(null_arg("out"));
  std::vector<foundry_log_entry> entries = Region::instance().log_entries(first, capacity);
  if (!entries.empty()) std::memcpy(out, entries.data(), entries.size() * sizeof(foundry_log_entry));
  if (written) *written = entries.size();
  return FOUNDRY_OK;
}

foundry_status foundry_region_log_tag(uint32_t index, char* buf, size_t buf_len) {
  if (buf == nullptr || buf_len == 0) return report(null_arg("buf"));
  std::string tag = Region::instance().log_tag(index);
  std::strncpy(buf, tag.c_str(), buf_len - 1);
  buf[buf_len - 1] = '\0';
  return FOUNDRY_OK;
}

foundry_status foundry_region_expect(const foundry_log_entry* entries, uint64_t count) {
  if (entries == nullptr && count) return report(null_arg("entries"));
  Region::instance().expect(std::vector<foundry_log_entry>(entries, entries + count));
  return FOUNDRY_OK;
}

foundry_status foundry_region_divergence(int* diverged, foundry_log_entry* expected, foundry_log_entry* actual) {
  if (diverged == nullptr) return report(null_arg("diverged"));
  foundry_log_entry e{}, a{};
  *diverged = Region::instance().divergence(&e, &a) ? 1 : 0;
  if (*diverged) {
    if (expected) *expected = e;
    if (actual) *actual = a;
  }
  return FOUNDRY_OK;
}

}  // extern "C"
