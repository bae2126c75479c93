// The section container: the on-disk unit of every binary payload in an archive.
//
// Layout (all integers little-endian):
//   header, 64 bytes:
//     0  magic "FDRYCNT1"           8 bytes
//     8  u32 format_version         (kContainerVersion)
//     12 u32 section_count
//     16 u64 file_size              the whole file, so truncation/extension is detected up front
//     24 u64 table_checksum         hash64 of the section table
//     32 u64 header_checksum        hash64 of bytes [0, 32)
//     40 reserved, must be zero     (not covered by a checksum, so it is checked to be zero)
//   section table: section_count entries of 32 bytes
//     u32 type (caller-defined id), u32 flags (caller-defined), u64 offset, u64 size,
//     u64 checksum (hash64 of the section bytes)
//   section data: each section starts 8-byte aligned; every byte not inside a section (alignment
//   padding) must be zero, so that no byte of a valid file escapes validation.
//
// Duplicate section types are allowed (e.g. one section per graph); find() returns the first in
// table order and find_all() returns every one, so the choice is deterministic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "archive/bytes.h"
#include "archive/file_bytes.h"
#include "common/status.h"

namespace foundry {

constexpr uint32_t kContainerVersion = 1;
constexpr size_t kContainerHeaderSize = 64;
constexpr size_t kContainerEntrySize = 32;
constexpr uint64_t kDefaultMaxContainerSize = 16ull << 30;  // 16 GiB

class ContainerWriter {
 public:
  void add(uint32_t type, std::vector<uint8_t> bytes, uint32_t flags = 0);
  size_t section_count() const { return sections_.size(); }
  // The complete container file image.
  std::vector<uint8_t> finish() const;

 private:
  struct Pending {
    uint32_t type;
    uint32_t flags;
    std::vector<uint8_t> bytes;
  };
  std::vector<Pending> sections_;
};

// Writes the container to path + ".tmp.<pid>.<n>", fsyncs it, renames it over `path` and fsyncs
// the directory, so `path` holds either the old file or the complete new one.
Status write_container_file(const std::string& path, const ContainerWriter& writer);

struct Section {
  uint32_t type = 0;
  uint32_t flags = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
};

// A validated container held in memory. Sections and readers point into its buffer: they stay
// valid while this Container (or the one it is moved into) lives.
// Reads `section` of a container's file again (Container::file(), at the section's offset) into
// out (section.size bytes) and checks it against the checksum it had when the container was read:
// FOUNDRY_ERR_MISMATCH naming `name` when the file changed since, FOUNDRY_ERR_IO when it is now
// shorter than that or the read fails.
Status read_section_again(const OpenFile& file, const Section& section, const std::string& name, uint8_t* out);

class Container {
 public:
  Container() = default;

  // Validates everything (see the layout above) before returning; errors name `name_for_errors`.
  static Result<Container> parse(std::vector<uint8_t> bytes, const std::string& name_for_errors);
  // Reads (maps, see FileBytes) and parses a file. Refuses a symlink in place of the file,
  // anything that is not a regular file, and files larger than max_size.
  static Result<Container> read_file(const std::string& path, uint64_t max_size = kDefaultMaxContainerSize);

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  size_t file_size() const { return bytes_.size(); }

  const std::vector<Section>& sections() const { return sections_; }
  std::vector<Section>::const_iterator begin() const { return sections_.begin(); }
  std::vector<Section>::const_iterator end() const { return sections_.end(); }

  // The first section of this type, or null.
  const Section* find(uint32_t type) const;
  std::vector<const Section*> find_all(uint32_t type) const;
  ByteSpan data(const Section& section) const;
  // The file read_file read, held open for reading a section again later (OpenFile::read_at at
  // the section's offset, then its checksum); null for a container parsed from memory.
  const std::shared_ptr<const OpenFile>& file() const { return bytes_.file(); }
  // A reader over the first section of this type; FOUNDRY_ERR_NOT_FOUND when there is none.
  Result<ByteReader> reader(uint32_t type) const;

 private:
  static Result<Container> parse_file_bytes(FileBytes bytes, const std::string& name_for_errors);

  std::string name_;
  uint32_t version_ = 0;
  FileBytes bytes_;
  std::vector<Section> sections_;
};

}  // namespace foundry
