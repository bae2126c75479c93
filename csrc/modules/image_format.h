// Pure parsing of CUDA kernel images (no driver calls): what a load call was handed, how many
// bytes it spans, what a fatbin contains, and which kernels a cubin defines.
//
// Every parse is bounds-checked against the size it is given, so corrupt or truncated input is
// refused with a FOUNDRY_ERR_FORMAT status naming the cause rather than read past its end. The one
// exception is a fatbin wrapper, whose pointers lead into process memory of unknown extent: there
// the sizes come from the fatbin headers (capped at kMaxImageBytes) and every pointed-to range is
// probed for readability before it is touched, so a wild pointer fails instead of crashing.
//
// Formats, as verified against nvcc 13.0 output (see image_format.cpp for the details):
//   __fatBinC_Wrapper_t  {i32 magic 0x466243B1, i32 version, u64* data, void* filename_or_fatbins}
//   fatbin container     {u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 payload_size},
//                        followed by entries, each {64-byte fixed header [+ extension], payload}
//   cubin                a 64-bit little-endian ELF (e_machine EM_CUDA = 190)
//   PTX                  NUL-terminated text
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "capi/foundry.h"
#include "common/status.h"

namespace foundry {

// Values equal the C API's foundry_image_kind.
enum class ImageKind : uint32_t {
  kUnknown = FOUNDRY_IMAGE_UNKNOWN,
  kFatbinWrapper = FOUNDRY_IMAGE_FATBIN_WRAPPER,
  kFatbin = FOUNDRY_IMAGE_FATBIN,
  kCubin = FOUNDRY_IMAGE_CUBIN,
  kPtx = FOUNDRY_IMAGE_PTX,
};

constexpr uint32_t kFatbinWrapperMagic = 0x466243B1u;
constexpr uint32_t kFatbinMagic = 0xBA55ED50u;
// No single image (or wrapper segment) is believed larger than this; a header claiming more is
// treated as corrupt.
constexpr uint64_t kMaxImageBytes = uint64_t(4) << 30;

struct Segment {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// A classified, measured image. For anything but a wrapper there is one segment: the image bytes
// themselves. For a wrapper the segments are the fatbins it points to, in this order:
//   version 1: [data]
//   version 2: [data, prelinked fatbin 0, prelinked fatbin 1, ...]. With -rdc, `data` is the
//              device-linked fatbin (executable cubins, what the driver loads when an arch
//              matches) and the NULL-terminated `filename_or_fatbins` array holds each
//              translation unit's relocatable fatbin (for JIT linking). A null `data` is skipped.
// Each wrapper segment is exactly one fatbin container: adjacent memory often holds other
// translation units' fatbins, which must not be absorbed.
struct ImageView {
  ImageKind kind = ImageKind::kUnknown;
  std::vector<Segment> segments;
  size_t total_size = 0;    // bytes of the image; for a wrapper, the sum of its segments' sizes
  int wrapper_version = 0;  // 1 or 2 for wrappers, 0 otherwise
};

// The kind suggested by the first bytes alone (kUnknown when max_size is too small to tell).
ImageKind classify_image(const void* data, size_t max_size);

// Classifies and measures the image at `data`, reading at most max_size bytes of it (a wrapper's
// pointees excepted, see above). Unknown or malformed images are FOUNDRY_ERR_FORMAT.
Result<ImageView> inspect_image(const void* data, size_t max_size);

// xxh64 (seed 0) of the concatenated segment bytes: a single-segment wrapper hashes the same as
// the fatbin it wraps.
uint64_t image_content_hash(const ImageView& view);

// Sizes of the individual formats, each validated within max_size.
// fatbin_size: one container, or several back-to-back (the sum, while the next 4 bytes are the
// magic). fatbin_container_size: exactly the first container.
Result<size_t> fatbin_size(const uint8_t* data, size_t max_size);
Result<size_t> fatbin_container_size(const uint8_t* data, size_t max_size);
// max(end of the section header table, end of the program header table, end of every section's
// and segment's file data), after validating every one of those offsets.
Result<size_t> elf_image_size(const uint8_t* data, size_t max_size);
// Bytes up to and including the terminating NUL.
Result<size_t> ptx_size(const uint8_t* data, size_t max_size);

// Entry kinds seen in fatbins.
constexpr uint16_t kFatbinEntryPtx = 1;
constexpr uint16_t kFatbinEntryCubin = 2;
constexpr uint16_t kFatbinEntryLtoIr = 8;  // code=lto_XX (NVVM IR for link-time optimisation)

// Entry flag bits (nvcc 13): compression codec, and arch-variant markers.
constexpr uint64_t kFatbinFlagDebug = 0x2;              // -G
constexpr uint64_t kFatbinFlagCompressedLz4 = 0x2000;   // -compress-mode=speed
constexpr uint64_t kFatbinFlagCompressedZstd = 0x8000;  // the default codec
constexpr uint64_t kFatbinFlagArchSpecific = 0x100000;  // sm_XXa
constexpr uint64_t kFatbinFlagFamilySpecific = 0x200000;  // sm_XXf

struct FatbinEntry {
  uint16_t kind = 0;     // kFatbinEntry*
  uint32_t arch = 0;     // e.g. 90 for sm_90 / compute_90
  uint16_t major = 0;    // PTX: ISA version (9.0 under CUDA 13); cubin: 1.8
  uint16_t minor = 0;
  uint64_t flags = 0;
  bool compressed = false;
  const uint8_t* payload = nullptr;
  size_t payload_size = 0;       // bytes stored after the header (may include padding)
  uint32_t compressed_size = 0;  // meaningful bytes of a compressed payload
  uint64_t uncompressed_size = 0;
  std::string name;              // source file name (-G builds), often empty
};

// The entries of the fatbin container(s) at data (back-to-back containers are all listed).
Result<std::vector<FatbinEntry>> list_fatbin_entries(const uint8_t* data, size_t size);

// The uncompressed cubin for exactly sm_<arch> (arch-specific sm_XXa, then family sm_XXf, then
// plain sm_XX are preferred in that order when several exist). Empty when there is none (a
// compressed entry counts as none: this layer does not decompress). The payload is validated as
// an ELF and trimmed to its measured size.
Result<std::vector<uint8_t>> extract_cubin(const uint8_t* fatbin, size_t size, int arch);

// Kernel entry points of a cubin: defined STT_FUNC symbols carrying STO_CUDA_ENTRY (0x10) in
// st_other. Device functions also get .text.<name> sections, so the section name alone does not
// distinguish kernels.
Result<std::vector<std::string>> cubin_kernel_names(const uint8_t* elf, size_t size);

}  // namespace foundry
