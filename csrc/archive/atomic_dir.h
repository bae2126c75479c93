// Crash-safe publishing of files and directories.
//
// An archive directory is built in a hidden sibling staging directory and renamed into place only
// when complete, so a crash leaves at most a dotted ".<name>.staging.*" directory (which readers
// ignore), never a half-written archive under the final name.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace foundry {

class StagingDir {
 public:
  // Creates `.<basename>.staging.<pid>.<random>` next to final_path (whose parent must exist).
  static Result<StagingDir> create(const std::string& final_path);

  StagingDir() = default;
  StagingDir(StagingDir&& other) noexcept;
  StagingDir& operator=(StagingDir&& other) noexcept;
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  // Removes the staging directory unless it was published.
  ~StagingDir();

  const std::string& path() const { return path_; }
  const std::string& final_path() const { return final_path_; }
  bool published() const { return published_; }

  // fsyncs every file and directory under the staging directory, then renames it to final_path.
  // An existing directory at final_path is replaced: atomically swapped (RENAME_EXCHANGE) where
  // the file system supports it, otherwise renamed aside first; the old one is then removed.
  // Either way a reader opening final_path sees the old or the new directory, never a mix.
  // An existing non-directory at final_path is refused.
  Status publish();

 private:
  void discard();

  std::string path_;
  std::string final_path_;
  bool published_ = false;
};

// Removes a file or directory tree without following symbolic links (a symlink inside the tree is
// removed itself; its target is untouched). A path that does not exist is not an error.
Status remove_tree(const std::string& path);

// fsyncs a file or directory.
Status fsync_path(const std::string& path);

// Writes path + ".tmp.<pid>.<n>" (mode 0644 before umask), fsyncs it, renames it over `path` and
// fsyncs the parent directory.
Status write_file_atomic(const std::string& path, const void* data, size_t size);

// dir + "/" + relative, for a relative name that comes from a manifest (untrusted): refuses an
// empty or absolute name, NUL bytes, empty components ("a//b", "a/"), "." and ".." components.
// Refusals are FOUNDRY_ERR_FORMAT.
Result<std::string> safe_join(const std::string& dir, const std::string& relative);

}  // namespace foundry
