#include "archive/file_bytes.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "common/load_settings.h"

namespace foundry {
namespace {

// Reads up to n bytes at `offset` into out, stopping early only where the file ends; *done says
// how many were read. FOUNDRY_ERR_IO naming `name` when a read fails.
Status pread_up_to(int fd, uint64_t offset, size_t n, uint8_t* out, const std::string& name, size_t* done) {
  *done = 0;
  while (*done < n) {
    ssize_t got = ::pread(fd, out + *done, n - *done, static_cast<off_t>(offset + *done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return Error(FOUNDRY_ERR_IO, name + ": read failed at offset " + std::to_string(offset + *done) + ": " +
                                       std::strerror(errno));
    }
    if (got == 0) break;
    *done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

Status copy_file(int fd, const std::string& path, size_t size, std::vector<uint8_t>* out) {
  try {
    out->resize(size);
  } catch (const std::bad_alloc&) {
    return Error(FOUNDRY_ERR_IO, path + ": out of memory reading " + std::to_string(size) + " bytes");
  }
  // Read what fstat promised. A file that shrinks meanwhile gives a short buffer, which the
  // container reports as truncated; one that grows is read only up to the size seen.
  size_t done = 0;
  FOUNDRY_RETURN_IF_ERROR(pread_up_to(fd, 0, size, out->data(), path, &done));
  out->resize(done);
  return Status::Ok();
}

// The file's pages mapped read-only, or null when mapping is not possible here (the caller copies).
const uint8_t* map_file(int fd, size_t size) {
  if (size == 0 || !map_archive_files()) return nullptr;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  // A file that shrank since fstat would fault past its new end: check before any byte is read.
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < size) {
    ::munmap(p, size);
    return nullptr;
  }
  return static_cast<const uint8_t*>(p);
}

}  // namespace

OpenFile::~OpenFile() { ::close(fd_); }

Status OpenFile::read_at(uint64_t offset, size_t n, uint8_t* out, const std::string& name) const {
  size_t done = 0;
  FOUNDRY_RETURN_IF_ERROR(pread_up_to(fd_, offset, n, out, name, &done));
  if (done < n) {
    return Error(FOUNDRY_ERR_IO, name + ": the file ends at offset " + std::to_string(offset + done) + ", before the " +
                                     std::to_string(n) + " bytes at " + std::to_string(offset) +
                                     " it had when opened (truncated since)");
  }
  return Status::Ok();
}

FileBytes::FileBytes(std::vector<uint8_t> owned)
    : owned_(std::move(owned)), data_(owned_.data()), size_(owned_.size()) {}

FileBytes::~FileBytes() { release(); }

FileBytes::FileBytes(FileBytes&& other) noexcept { *this = std::move(other); }

FileBytes& FileBytes::operator=(FileBytes&& other) noexcept {
  if (this == &other) return *this;
  release();
  // A moved vector keeps its heap buffer, so data_ stays valid for owned bytes too.
  file_ = std::move(other.file_);
  owned_ = std::move(other.owned_);
  data_ = other.data_;
  size_ = other.size_;
  mapped_ = other.mapped_;
  other.data_ = nullptr;
  other.size_ = 0;
  other.mapped_ = false;
  return *this;
}

void FileBytes::release() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), size_);
  file_.reset();
  owned_.clear();
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
}

Result<FileBytes> FileBytes::read(const std::string& path, uint64_t max_size) {
  // O_NOFOLLOW: a symlink planted in place of an archive file must not redirect the read.
  // O_NONBLOCK: opening a FIFO put in its place must not hang; it is then refused as non-regular.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return Error(FOUNDRY_ERR_NOT_FOUND, path + ": no such file");
    if (err == ELOOP) return Error(FOUNDRY_ERR_IO, path + ": is a symbolic link; refusing to follow it");
    return Error(FOUNDRY_ERR_IO, path + ": cannot open: " + std::strerror(err));
  }
  // Owned from here on: closed on every error below, and kept open with the bytes read.
  std::shared_ptr<const OpenFile> file;
  try {
    file = std::make_shared<OpenFile>(fd);
  } catch (const std::bad_alloc&) {
    ::close(fd);
    return Error(FOUNDRY_ERR_IO, path + ": out of memory");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error(FOUNDRY_ERR_IO, path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Error(FOUNDRY_ERR_IO, path + ": not a regular file");
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_size)
    return Error(FOUNDRY_ERR_FORMAT, path + ": the file is " + std::to_string(size) + " bytes, more than the " +
                                         std::to_string(max_size) + "-byte limit for a container");
  FileBytes out;
  if (const uint8_t* p = map_file(fd, static_cast<size_t>(size))) {
    out.data_ = p;
    out.size_ = static_cast<size_t>(size);
    out.mapped_ = true;
  } else {
    std::vector<uint8_t> bytes;
    FOUNDRY_RETURN_IF_ERROR(copy_file(fd, path, static_cast<size_t>(size), &bytes));
    out = FileBytes(std::move(bytes));
  }
  out.file_ = std::move(file);
  return Result<FileBytes>(std::move(out));
}

}  // namespace foundry
