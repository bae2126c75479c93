// An archived kernel image file, images/<hash16>.fimg: a section container holding one META
// section, then the image bytes as one or more SEGMENT sections (several for a -rdc wrapper).
//
// META (little-endian): u32 version (kImageMetaVersion), u64 hash, u64 size, u32 kind,
// u32 loader (0 module, 1 library), u32 wrapper_version, u32 arch (the cubin's arch when SAVE
// reduced a fatbin to one cubin, else 0), u32 nvshmem, u32 entry count, then each entry name as
// a u64-length-prefixed string.
//
// The reader is shared by LOAD (Registry::read_and_load) and the inspection tools, so both accept
// exactly the same files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace foundry {

constexpr uint32_t kImageSectionMeta = 1;
constexpr uint32_t kImageSectionSegment = 2;
constexpr uint32_t kImageMetaVersion = 1;
constexpr const char* kImageFileSuffix = ".fimg";
constexpr size_t kMaxImageEntryName = 1 << 16;

struct ImageFileInfo {
  uint64_t hash = 0;
  uint64_t size = 0;  // bytes of the image as it was loaded at SAVE
  uint32_t kind = 0;  // foundry_image_kind
  uint32_t loader = 0;
  uint32_t wrapper_version = 0;
  uint32_t arch = 0;
  uint32_t nvshmem = 0;
  std::vector<std::string> entries;
  std::vector<uint64_t> segment_sizes;         // bytes stored per segment, always filled
  std::vector<std::vector<uint8_t>> segments;  // the stored bytes, when asked for
};

// "<16 lowercase hex digits>.fimg", the name an image with this hash is stored under.
std::string image_file_name(uint64_t hash);
// The hash a path's file name stands for when it has that form (read_image_file refuses a file
// whose content has another hash), else false.
bool image_file_hash(const std::string& path, uint64_t* hash);

// Reads and validates an image file: the container (checksums, bounds), the metadata, a known
// loader, a file name matching the hash and at least one segment. With copy_segments false only
// the segment sizes are kept (inspection does not need the bytes).
Result<ImageFileInfo> read_image_file(const std::string& path, bool copy_segments = true);

// Writes an image file holding `info`'s metadata and `info.segments` (atomically, see
// write_container_file). The file name is not checked: callers pass dir + image_file_name(hash).
Status write_image_file(const std::string& path, const ImageFileInfo& info);

}  // namespace foundry
