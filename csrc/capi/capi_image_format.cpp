// C boundary of the pure image-parsing helpers (foundry.h, "kernel images" section).
#include <cstring>
#include <string>
#include <vector>

#include "capi/errors.h"
#include "capi/foundry.h"
#include "common/hash.h"
#include "modules/image_format.h"

using foundry::Error;
using foundry::report;

extern "C" {

FOUNDRY_API foundry_status foundry_image_inspect(const void* data, uint64_t max_size, uint32_t* kind,
                                                 uint64_t* size, uint32_t* segments) {
  if (data == nullptr) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "foundry_image_inspect: data is null"));
  foundry::Result<foundry::ImageView> view = foundry::inspect_image(data, size_t(max_size));
  if (!view.ok()) return report(view.status());
  // Each out-parameter is optional: a caller may only want the kind, or only the size.
  if (kind != nullptr) *kind = static_cast<uint32_t>(view.value().kind);
  if (size != nullptr) *size = view.value().total_size;
  if (segments != nullptr) *segments = static_cast<uint32_t>(view.value().segments.size());
  return FOUNDRY_OK;
}

FOUNDRY_API foundry_status foundry_fatbin_extract_cubin(const void* fatbin, uint64_t size, int arch,
                                                        void* out, uint64_t capacity, uint64_t* out_size) {
  if (fatbin == nullptr || out_size == nullptr)
    return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT,
                        std::string("foundry_fatbin_extract_cubin: ") + (fatbin ? "out_size" : "fatbin") +
                            " is null"));
  foundry::Result<std::vector<uint8_t>> cubin =
      foundry::extract_cubin(static_cast<const uint8_t*>(fatbin), size_t(size), arch);
  if (!cubin.ok()) return report(cubin.status());
  const std::vector<uint8_t>& bytes = cubin.value();
  if (out != nullptr) {
    // Refuse rather than truncate: a partial cubin would load as garbage. The caller can ask for
    // the size first by passing out = NULL.
    if (capacity < bytes.size())
      return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT,
                          "foundry_fatbin_extract_cubin: capacity " + std::to_string(capacity) +
                              " is smaller than the sm_" + std::to_string(arch) + " cubin (" +
                              std::to_string(bytes.size()) + " bytes)"));
    if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
  }
  *out_size = bytes.size();
  return FOUNDRY_OK;
}

// No status to return here: a null pointer is hashed as empty input.
FOUNDRY_API uint64_t foundry_hash64(const void* data, uint64_t size, uint64_t seed) {
  if (data == nullptr) return foundry::hash64(nullptr, 0, seed);
  return foundry::hash64(data, size_t(size), seed);
}

}  // extern "C"
