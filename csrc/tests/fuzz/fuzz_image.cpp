// libFuzzer target for the kernel-image parsers (fatbin wrapper, fatbin, cubin/ELF, PTX): what
// SAVE runs on every module an application loads and `foundry verify` runs on archived images
// (built by scripts/build-fuzz; not a ctest).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "modules/image_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);  // an exact-size heap copy: ASan sees overreads
  // A fatbin wrapper holds pointers into the loading process (followed by design): not file data.
  if (foundry::classify_image(bytes.data(), bytes.size()) != foundry::ImageKind::kFatbinWrapper) {
    auto view = foundry::inspect_image(bytes.data(), bytes.size());
    if (view.ok() && view.value().total_size > bytes.size()) __builtin_trap();
  }
  auto entries = foundry::list_fatbin_entries(bytes.data(), bytes.size());
  if (entries.ok()) {
    for (const auto& e : entries.value()) (void)e;
    auto cubin = foundry::extract_cubin(bytes.data(), bytes.size(), 90);
    if (cubin.ok()) (void)foundry::cubin_kernel_names(cubin.value().data(), cubin.value().size());
  }
  (void)foundry::cubin_kernel_names(bytes.data(), bytes.size());
  return 0;
}
