// FileBytes: the bytes of one archive file held in memory, either a buffer it owns or a read-only
// private mapping of the file.
//
// Why a mapping: LOAD reads whole payload files of a few hundred MB. Copying one into a fresh
// buffer costs a zero-fill and a page fault per page of that buffer (about 0.12 s per 80 MB on a
// server core); mapping the file's cached pages with MAP_POPULATE costs about a tenth of that.
//
// The mapping's one hazard is a file truncated *in place* while it is mapped: touching a page past
// the new end raises SIGBUS. Foundry never truncates an archive file in place (every write goes to
// a temporary file renamed over the old one, so a mapping keeps the old inode), the mapping lives
// only while the container is validated and parsed, and a file that shrank between stat and map is
// caught before any byte is read. Set FOUNDRY_READ_MAP=0 to always copy instead.
//
// A reader that needs some bytes only later (lazy LOAD's pending deltas) keeps the OpenFile, not
// the mapping, and reads them again then with pread: a file truncated in place meanwhile gives a
// short read, never a fault, and a file replaced by rename is still the one read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "archive/bytes.h"
#include "common/status.h"

namespace foundry {

// A file descriptor held open for reading again later; closed with the last owner.
class OpenFile {
 public:
  explicit OpenFile(int fd) : fd_(fd) {}
  ~OpenFile();
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  // Reads exactly n bytes at `offset` into out (safe from several threads at once). FOUNDRY_ERR_IO
  // naming `name` when the read fails or the file now ends before offset + n.
  Status read_at(uint64_t offset, size_t n, uint8_t* out, const std::string& name) const;

 private:
  int fd_;
};

class FileBytes {
 public:
  FileBytes() = default;
  explicit FileBytes(std::vector<uint8_t> owned);
  ~FileBytes();
  FileBytes(FileBytes&& other) noexcept;
  FileBytes& operator=(FileBytes&& other) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;

  // Reads a regular file of at most max_size bytes: mapped when it can be (and FOUNDRY_READ_MAP is
  // not 0), else copied. Refuses a symlink in place of the file and anything not a regular file.
  static Result<FileBytes> read(const std::string& path, uint64_t max_size);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  ByteSpan span() const { return ByteSpan{data_, size_}; }
  bool mapped() const { return mapped_; }
  // The file these bytes were read from, still open; null for bytes that came from memory.
  const std::shared_ptr<const OpenFile>& file() const { return file_; }

 private:
  void release();

  std::shared_ptr<const OpenFile> file_;
  std::vector<uint8_t> owned_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace foundry
