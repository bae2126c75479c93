// The kernel-image registry: every image the process loads (modules and libraries), identified by
// content hash, with the handles it was loaded as. It answers "which image and entry is this
// CUfunction?" at SAVE, packs the images a set of graphs uses, reloads them at LOAD, and makes the
// process's own later load of an identical image return the already-loaded handle, so that the
// engine and the restored graphs share one module and its __device__/__constant__ state.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "capi/foundry.h"
#include "common/status.h"

namespace foundry {

enum class Loader : uint32_t { kModule = 0, kLibrary = 1 };

// An image as seen at a load call, before the driver loads it.
struct PendingImage {
  bool parsed = false;
  uint32_t kind = FOUNDRY_IMAGE_UNKNOWN;
  uint64_t size = 0;
  int wrapper_version = 0;
  // Segment bytes: views into memory that outlives the process's use of the image (a loaded
  // object's sections), or into `owned` copies for transient buffers.
  std::vector<std::pair<const uint8_t*, size_t>> segments;
  std::vector<std::vector<uint8_t>> owned;
};

struct ImageRecord {
  uint64_t hash = 0;
  bool hashed = false;
  uint64_t size = 0;
  uint32_t kind = FOUNDRY_IMAGE_UNKNOWN;
  int wrapper_version = 0;
  Loader loader = Loader::kModule;
  std::vector<std::pair<const uint8_t*, size_t>> segments;
  std::vector<std::vector<uint8_t>> owned;
  std::vector<CUmodule> modules;
  std::vector<CUlibrary> libraries;
  std::vector<std::string> entries;  // sorted
  bool entries_known = false;
  int nvshmem = -1;  // -1 unknown
  bool from_archive = false;
  bool loaded = true;  // false: an archived image read and checked, handed to the driver at first need
  bool load_failed = false;  // a lazy load the driver refused: the record is dead (the process's own load replaces it)
  CUcontext ctx = nullptr;   // the context a lazily loaded module goes into (LOAD's, not the first user's)
  bool library_modules_known = false;  // its libraries' modules are in Registry::by_module_
  std::string path;    // the archived file, named in errors
  std::unordered_map<std::string, CUfunction> resolved;
  std::unique_ptr<uint8_t[]> wrapper_storage;  // a rebuilt fatbin wrapper (LOAD of -rdc images)
};

class Registry {
 public:
  static Registry& instance();

  // Reads an image handed to a load call (never fails: unparseable images are passed through).
  PendingImage inspect(const void* image, bool copy_transient);
  PendingImage inspect_file(const char* path);
  // At LOAD: the handle of an archived image identical to `p`, loaded by the same loader.
  bool find_archived(PendingImage& p, Loader loader, void** handle);
  void add(PendingImage p, Loader loader, void* handle);
  // True (and nothing should be unloaded) when the handle belongs to an archived image.
  bool is_archived_handle(void* handle, Loader loader);
  void forget_handle(void* handle, Loader loader);

  uint64_t count();
  Status record_at(uint64_t index, foundry_image_record* out);
  Result<std::string> entry_name(uint64_t hash, uint32_t i);

  // (image hash, entry name) of a function (or kernel) handle.
  Status lookup(CUfunction func, CUkernel kern, uint64_t* hash, std::string* name);
  Result<CUfunction> resolve(uint64_t hash, const std::string& name);
  // Whether (hash, name) names an entry of a loaded image, from the entries archived images list
  // (no driver call, no function loaded); FOUNDRY_ERR_NOT_FOUND naming what is missing.
  Status check_entry(uint64_t hash, const std::string& name);

  Status pack(const std::string& dir, const std::vector<uint64_t>& hashes, int arch);
  // Reads and checks every image packed in `dir`. With `lazy`, an image goes to the driver only
  // when a kernel of it is resolved or the process loads an identical image itself; otherwise now.
  Result<uint64_t> load_dir(const std::string& dir, bool lazy = false);
  Result<uint64_t> init_nvshmem();

 private:
  ImageRecord* by_hash(uint64_t hash);
  void ensure_hashed(ImageRecord& r);
  Status ensure_entries(ImageRecord& r);
  ImageRecord* find_by_module(CUmodule mod);
  // An archived image read from `path` and checked and, unless `lazy`, handed to the driver
  // (outside mu_); nullptr when an identical archived image was read (lazy) or loaded before.
  Result<std::unique_ptr<ImageRecord>> read_and_load(const std::string& path, bool lazy);
  // Registers what read_and_load made (mu_ taken); false when an identical image went in
  // meanwhile (a loaded duplicate is unloaded again).
  bool commit(std::unique_ptr<ImageRecord> r, bool lazy);
  ImageRecord* archived_record(uint64_t hash);  // caller holds mu_
  // An archived image of this hash was read (for a lazy read) or loaded before: nothing to do
  // (caller holds mu_).
  bool done_before(uint64_t hash, bool lazy);
  // How many threads load_dir reads (and loads) `files` image files on.
  static size_t image_threads(size_t files, bool lazy);
  static constexpr size_t kImagesPerThread = 16;
  // Hands an archived image read by read_and_load to the driver, into the record's context. Lazy
  // records are loaded with mu_ held (a first resolve or the process's identical load waits).
  Status load_record(ImageRecord& r);
  // A lazy record at first need: loaded, or marked dead with a warning when the driver refuses it.
  Status load_lazy_record(ImageRecord& r);
  void register_handles(ImageRecord& r);  // caller holds mu_
  // Gives `into` (a lazy record) the handles and bytes `from` was loaded with (caller holds mu_).
  void adopt_handles(ImageRecord& into, ImageRecord& from);
  void unload_record(ImageRecord& r);  // a duplicate loaded by a racing reader

  std::recursive_mutex mu_;
  std::vector<std::unique_ptr<ImageRecord>> records_;
  std::unordered_map<void*, ImageRecord*> by_handle_;
  std::unordered_map<CUmodule, ImageRecord*> by_module_;  // includes modules of libraries, filled lazily
  uint64_t archived_count_ = 0;
};

}  // namespace foundry
