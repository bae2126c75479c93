#include "archive/atomic_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/log.h"

namespace foundry {

namespace {

// Deep enough for any archive; bounds recursion (stack and open descriptors) on hostile trees.
constexpr int kMaxTreeDepth = 128;

std::string errno_text(int err) { return std::strerror(err); }

Status io_error(const std::string& path, const std::string& action, int err) {
  return Error(FOUNDRY_ERR_IO, path + ": " + action + ": " + errno_text(err));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports the error: for a written file, close() can be where it surfaces.
  int close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Some file systems cannot fsync a directory (EINVAL); there is nothing more to do there.
Status fsync_fd(int fd, const std::string& path) {
  if (::fsync(fd) != 0 && errno != EINVAL) return io_error(path, "fsync failed", errno);
  return Status::Ok();
}

// Splits a path into its parent directory and last component, ignoring trailing slashes.
void split_path(const std::string& path, std::string* parent, std::string* base) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  if (slash == std::string::npos) {
    *parent = ".";
    *base = p;
  } else {
    *parent = slash == 0 ? "/" : p.substr(0, slash);
    *base = p.substr(slash + 1);
  }
}

std::string parent_of(const std::string& path) {
  std::string parent, base;
  split_path(path, &parent, &base);
  return parent;
}

// A name suffix unique enough that concurrent stagings (threads, processes) do not collide;
// mkdir's EEXIST catches the rest.
std::string random_suffix() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
    static std::atomic<uint64_t> counter{0};
    uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    r = t * 0x9E3779B97F4A7C15ull ^ counter.fetch_add(1);
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

// The names in an open directory, "." and ".." excluded. Takes ownership of dir_fd. Names are
// collected before anything is removed, so deletion does not race the directory stream.
Status list_dir(int dir_fd, const std::string& path, std::vector<std::string>* names) {
  DIR* dir = ::fdopendir(dir_fd);
  if (dir == nullptr) {
    int err = errno;
    ::close(dir_fd);
    return io_error(path, "cannot list directory", err);
  }
  errno = 0;
  while (struct dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names->push_back(e->d_name);
    errno = 0;
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0) return io_error(path, "cannot list directory", err);
  return Status::Ok();
}

// Opens a directory relative to a parent descriptor without following a symlink in its place.
int open_dir_at(int parent_fd, const char* name) {
  return ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

// Removes everything inside the directory open as dir_fd (which stays open).
Status remove_contents(int dir_fd, const std::string& path, int depth) {
  if (depth > kMaxTreeDepth) return Error(FOUNDRY_ERR_IO, path + ": directory tree deeper than " +
                                                              std::to_string(kMaxTreeDepth) + " levels");
  int list_fd = ::dup(dir_fd);  // list_dir consumes its descriptor
  if (list_fd < 0) return io_error(path, "dup failed", errno);
  std::vector<std::string> names;
  FOUNDRY_RETURN_IF_ERROR(list_dir(list_fd, path, &names));

  for (const std::string& name : names) {
    std::string child = path + "/" + name;
    struct stat st;
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed concurrently: the goal is reached
      return io_error(child, "cannot stat", errno);
    }
    if (S_ISDIR(st.st_mode)) {
      Fd sub(open_dir_at(dir_fd, name.c_str()));
      if (sub.get() < 0) return io_error(child, "cannot open directory", errno);
      FOUNDRY_RETURN_IF_ERROR(remove_contents(sub.get(), child, depth + 1));
    }
    if (::unlinkat(dir_fd, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0 && errno != ENOENT)
      return io_error(child, "cannot remove", errno);
  }
  return Status::Ok();
}

// fsyncs every regular file and directory below (and including) the directory open as dir_fd.
// Symlinks and special files are not followed; the directory fsync covers their entries.
Status fsync_tree(int dir_fd, const std::string& path, int depth) {
  if (depth > kMaxTreeDepth) return Error(FOUNDRY_ERR_IO, path + ": directory tree deeper than " +
                                                              std::to_string(kMaxTreeDepth) + " levels");
  int list_fd = ::dup(dir_fd);
  if (list_fd < 0) return io_error(path, "dup failed", errno);
  std::vector<std::string> names;
  FOUNDRY_RETURN_IF_ERROR(list_dir(list_fd, path, &names));

  for (const std::string& name : names) {
    std::string child = path + "/" + name;
    struct stat st;
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return io_error(child, "cannot stat", errno);
    if (S_ISDIR(st.st_mode)) {
      Fd sub(open_dir_at(dir_fd, name.c_str()));
      if (sub.get() < 0) return io_error(child, "cannot open directory", errno);
      FOUNDRY_RETURN_IF_ERROR(fsync_tree(sub.get(), child, depth + 1));
    } else if (S_ISREG(st.st_mode)) {
      Fd file(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (file.get() < 0) return io_error(child, "cannot open", errno);
      FOUNDRY_RETURN_IF_ERROR(fsync_fd(file.get(), child));
    }
  }
  return fsync_fd(dir_fd, path);
}

// The fallback when the file system has no renameat2 flags: move the old directory aside, move the
// new one in, then delete the old one. Between the two renames final_path briefly does not exist
// (a reader sees "not found", never a mix); if the second rename fails the old one is put back.
Status replace_by_rename_aside(const std::string& staging, const std::string& final_path) {
  std::string parent, base;
  split_path(final_path, &parent, &base);
  std::string aside = parent + "/." + base + ".old." + std::to_string(::getpid()) + "." + random_suffix();
  if (::rename(final_path.c_str(), aside.c_str()) != 0)
    return io_error(final_path, "cannot move the existing directory aside", errno);
  if (::rename(staging.c_str(), final_path.c_str()) != 0) {
    int err = errno;
    if (::rename(aside.c_str(), final_path.c_str()) != 0)
      LOG_ERROR("%s: could not restore the previous directory from %s: %s", final_path.c_str(), aside.c_str(),
                std::strerror(errno));
    return io_error(final_path, "cannot rename " + staging + " into place", err);
  }
  Status removed = remove_tree(aside);
  if (!removed.ok()) LOG_WARNING("publish: leftover %s: %s", aside.c_str(), removed.message().c_str());
  return Status::Ok();
}

}  // namespace

Result<StagingDir> StagingDir::create(const std::string& final_path) {
  std::string parent, base;
  split_path(final_path, &parent, &base);
  if (base.empty() || base == "." || base == ".." || base == "/")
    return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "'" + final_path + "': not a usable directory name to publish");

  // A few attempts in case of a name collision (practically impossible with 64 random bits).
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::string path =
        parent + "/." + base + ".staging." + std::to_string(::getpid()) + "." + random_suffix();
    if (::mkdir(path.c_str(), 0755) == 0) {
      StagingDir s;
      s.path_ = path;
      s.final_path_ = final_path;
      return Result<StagingDir>(std::move(s));  // move-only: spelled out for C++17
    }
    if (errno != EEXIST) {
      int err = errno;
      if (err == ENOENT) return Error(FOUNDRY_ERR_NOT_FOUND, parent + ": parent directory of " + final_path +
                                                                 " does not exist");
      return io_error(path, "cannot create staging directory", err);
    }
  }
  return Error(FOUNDRY_ERR_IO, final_path + ": could not find a free staging directory name");
}

StagingDir::StagingDir(StagingDir&& other) noexcept
    : path_(std::move(other.path_)), final_path_(std::move(other.final_path_)), published_(other.published_) {
  other.path_.clear();
  other.published_ = false;
}

StagingDir& StagingDir::operator=(StagingDir&& other) noexcept {
  if (this != &other) {
    discard();
    path_ = std::move(other.path_);
    final_path_ = std::move(other.final_path_);
    published_ = other.published_;
    other.path_.clear();
    other.published_ = false;
  }
  return *this;
}

StagingDir::~StagingDir() { discard(); }

void StagingDir::discard() {
  if (path_.empty() || published_) return;
  Status s = remove_tree(path_);
  if (!s.ok()) LOG_WARNING("could not remove staging directory: %s", s.message().c_str());
  path_.clear();
}

Status StagingDir::publish() {
  if (path_.empty()) return Error(FOUNDRY_ERR_STATE, "publish: no staging directory");
  if (published_) return Error(FOUNDRY_ERR_STATE, final_path_ + ": already published");

  {
    Fd dir(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir.get() < 0) return io_error(path_, "cannot open staging directory", errno);
    FOUNDRY_RETURN_IF_ERROR(fsync_tree(dir.get(), path_, 0));
  }

  const char* from = path_.c_str();
  const char* to = final_path_.c_str();
  bool fallback = false;
  if (::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) != 0) {
    int err = errno;
    if (err == EINVAL || err == ENOSYS) {
      fallback = true;
    } else if (err != EEXIST) {
      return io_error(final_path_, "cannot rename " + path_ + " into place", err);
    } else {
      // Something is there: only a directory (not a symlink to one) is ours to replace.
      struct stat st;
      if (::lstat(to, &st) != 0) return io_error(final_path_, "cannot stat", errno);
      if (!S_ISDIR(st.st_mode))
        return Error(FOUNDRY_ERR_IO, final_path_ + ": exists and is not a directory; refusing to replace it");
      if (::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE) == 0) {
        // The staging name now holds the previous directory.
        Status removed = remove_tree(path_);
        if (!removed.ok()) LOG_WARNING("publish: leftover %s", removed.message().c_str());
      } else if (errno == EINVAL || errno == ENOSYS) {
        fallback = true;
      } else {
        return io_error(final_path_, "cannot exchange " + path_ + " with it", errno);
      }
    }
  }

  if (fallback) {
    struct stat st;
    if (::lstat(to, &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        return Error(FOUNDRY_ERR_IO, final_path_ + ": exists and is not a directory; refusing to replace it");
      FOUNDRY_RETURN_IF_ERROR(replace_by_rename_aside(path_, final_path_));
    } else if (::rename(from, to) != 0) {
      return io_error(final_path_, "cannot rename " + path_ + " into place", errno);
    }
  }

  published_ = true;
  // The renames live in the parent directory; make them durable too.
  return fsync_path(parent_of(final_path_));
}

Status remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return io_error(path, "cannot stat", errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return io_error(path, "cannot remove", errno);
    return Status::Ok();
  }
  {
    Fd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir.get() < 0) return io_error(path, "cannot open directory", errno);
    FOUNDRY_RETURN_IF_ERROR(remove_contents(dir.get(), path, 0));
  }
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return io_error(path, "cannot remove directory", errno);
  return Status::Ok();
}

Status fsync_path(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return io_error(path, "cannot open for fsync", errno);
  return fsync_fd(fd.get(), path);
}

Status write_file_atomic(const std::string& path, const void* data, size_t size) {
  // The pid keeps processes apart, the counter keeps threads of one process apart.
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));

  // O_EXCL|O_NOFOLLOW: never write through a symlink or into a file someone else placed at the
  // temporary name. A same-named leftover from a crashed process with our pid is ours to replace.
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int raw_fd = ::open(tmp.c_str(), flags, 0644);
  if (raw_fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0) raw_fd = ::open(tmp.c_str(), flags, 0644);
  if (raw_fd < 0) return io_error(tmp, "cannot create", errno);
  Fd fd(raw_fd);

  auto fail = [&](const std::string& action, int err) {
    ::unlink(tmp.c_str());
    return io_error(tmp, action, err);
  };
  const uint8_t* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd.get(), p + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write failed at offset " + std::to_string(done), errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("fsync failed", errno);
  if (fd.close() != 0) return fail("close failed", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return io_error(path, "cannot rename " + tmp + " into place", err);
  }
  return fsync_path(parent_of(path));
}

Result<std::string> safe_join(const std::string& dir, const std::string& relative) {
  auto refuse = [&](const std::string& why) {
    // The name is untrusted: quote it with control bytes (NUL included) made visible.
    std::string shown;
    for (char c : relative) shown += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
    return Error(FOUNDRY_ERR_FORMAT, dir + ": refusing the relative name '" + shown + "': " + why);
  };
  if (relative.empty()) return refuse("it is empty");
  if (relative.find('\0') != std::string::npos) return refuse("it contains a NUL byte");
  if (relative.front() == '/') return refuse("it is absolute");

  size_t start = 0;
  while (start <= relative.size()) {
    size_t slash = relative.find('/', start);
    size_t end = slash == std::string::npos ? relative.size() : slash;
    std::string component = relative.substr(start, end - start);
    if (component.empty()) return refuse("it has an empty component");
    if (component == "." || component == "..") return refuse("it has a '" + component + "' component");
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (dir.empty()) return relative;
  return dir.back() == '/' ? dir + relative : dir + "/" + relative;
}

}  // namespace foundry
