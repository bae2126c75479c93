#include "modules/registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>

#include "archive/bytes.h"
#include "archive/container.h"
#include "common/hash.h"
#include "common/load_settings.h"
#include "common/log.h"
#include "common/parallel.h"
#include "driver/driver.h"
#include "modules/image_file.h"
#include "modules/image_format.h"

namespace foundry {
namespace {

// The image file format lives in modules/image_file.h; these names keep pack() unchanged.
constexpr uint32_t kSectionMeta = kImageSectionMeta;
constexpr uint32_t kSectionSegment = kImageSectionSegment;
constexpr const char* kImageSuffix = kImageFileSuffix;
constexpr const char* kNvshmemProbe = "nvshmemi_device_state_d";

// The layout of __fatBinC_Wrapper_t (fatbinary_section.h), rebuilt at LOAD for -rdc images.
struct FatbinWrapper {
  int magic;
  int version;
  const unsigned long long* data;
  void* filename_or_fatbins;
};
constexpr int kWrapperMagic = 0x466243B1;

std::string hash_name(uint64_t hash) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, hash);
  return buf;
}

// Memory inside a loaded object's mapping lives as long as the object (the fatbins cudart
// registers live in .nv_fatbin of a loaded library): no need to copy it.
bool in_loaded_object(const uint8_t* p, size_t n) {
  Dl_info a{}, b{};
  if (n == 0 || dladdr(p, &a) == 0 || dladdr(p + n - 1, &b) == 0) return false;
  return a.dli_fbase != nullptr && a.dli_fbase == b.dli_fbase;
}

}  // namespace

Registry& Registry::instance() {
  static Registry* r = new Registry();  // never destroyed: load calls can come during exit
  return *r;
}

PendingImage Registry::inspect(const void* image, bool copy_transient) {
  PendingImage p;
  if (image == nullptr) return p;
  auto view = inspect_image(image, SIZE_MAX);
  if (!view.ok()) {
    LOG_DEBUG("image at %p not recognised: %s", image, view.status().message().c_str());
    return p;
  }
  p.parsed = true;
  p.kind = static_cast<uint32_t>(view.value().kind);
  p.size = view.value().total_size;
  p.wrapper_version = view.value().wrapper_version;
  for (const auto& seg : view.value().segments) {
    if (!copy_transient || in_loaded_object(seg.data, seg.size)) {
      p.segments.emplace_back(seg.data, seg.size);
    } else {
      p.owned.emplace_back(seg.data, seg.data + seg.size);
      p.segments.emplace_back(p.owned.back().data(), p.owned.back().size());
    }
  }
  return p;
}

PendingImage Registry::inspect_file(const char* path) {
  PendingImage p;
  std::ifstream in(path, std::ios::binary);
  if (!in) return p;
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!bytes.empty() && bytes.back() != 0) bytes.push_back(0);  // PTX text files need the NUL
  auto view = inspect_image(bytes.data(), bytes.size());
  if (!view.ok()) return p;
  p.parsed = true;
  p.kind = static_cast<uint32_t>(view.value().kind);
  p.size = view.value().total_size;
  p.wrapper_version = view.value().wrapper_version;
  bytes.resize(view.value().total_size);
  p.owned.push_back(std::move(bytes));
  p.segments.emplace_back(p.owned.back().data(), p.owned.back().size());
  return p;
}

static uint64_t hash_segments(const std::vector<std::pair<const uint8_t*, size_t>>& segments) {
  Hasher64 h;
  for (const auto& s : segments) h.update(s.first, s.second);
  return h.digest();
}

bool Registry::find_archived(PendingImage& p, Loader loader, void** handle) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (archived_count_ == 0 || !p.parsed) return false;
  // Hash only when an archived image has the same size: the common load pays nothing.
  bool candidate = std::any_of(records_.begin(), records_.end(), [&](const auto& r) {
    return r->from_archive && r->size == p.size && r->loader == loader;
  });
  if (!candidate) return false;
  uint64_t hash = hash_segments(p.segments);
  for (auto& r : records_) {
    if (!r->from_archive || r->load_failed || r->hash != hash || r->size != p.size || r->loader != loader) continue;
    if (!r->loaded && !load_lazy_record(*r).ok()) return false;  // the process's own load goes ahead
    if (loader == Loader::kLibrary && !r->libraries.empty()) *handle = r->libraries.front();
    else if (loader == Loader::kModule && !r->modules.empty()) *handle = r->modules.front();
    else continue;
    LOG_DEBUG("load of image %s answered with the archived handle", hash_name(hash).c_str());
    return true;
  }
  return false;
}

void Registry::add(PendingImage p, Loader loader, void* handle) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto r = std::make_unique<ImageRecord>();
  r->kind = p.kind;
  r->size = p.size;
  r->wrapper_version = p.wrapper_version;
  r->loader = loader;
  r->segments = std::move(p.segments);
  r->owned = std::move(p.owned);
  if (loader == Loader::kLibrary) r->libraries.push_back(static_cast<CUlibrary>(handle));
  else {
    r->modules.push_back(static_cast<CUmodule>(handle));
    by_module_[static_cast<CUmodule>(handle)] = r.get();
  }
  by_handle_[handle] = r.get();
  records_.push_back(std::move(r));
}

bool Registry::is_archived_handle(void* handle, Loader loader) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto it = by_handle_.find(handle);
  return it != by_handle_.end() && it->second->from_archive && it->second->loader == loader;
}

void Registry::forget_handle(void* handle, Loader loader) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end()) return;
  ImageRecord* r = it->second;
  by_handle_.erase(it);
  auto& mods = r->modules;
  auto& libs = r->libraries;
  if (loader == Loader::kModule) {
    mods.erase(std::remove(mods.begin(), mods.end(), static_cast<CUmodule>(handle)), mods.end());
    by_module_.erase(static_cast<CUmodule>(handle));
  } else {
    libs.erase(std::remove(libs.begin(), libs.end(), static_cast<CUlibrary>(handle)), libs.end());
  }
  r->resolved.clear();
}

uint64_t Registry::count() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return records_.size();
}

void Registry::ensure_hashed(ImageRecord& r) {
  if (r.hashed) return;
  r.hash = hash_segments(r.segments);
  r.hashed = true;
}

Status Registry::ensure_entries(ImageRecord& r) {
  if (r.entries_known) return Status::Ok();
  auto drv = driver();
  if (!drv.ok()) return drv.status();
  const Driver* d = drv.value();
  std::vector<std::string> names;
  if (!r.libraries.empty() && d->cuLibraryGetKernelCount && d->cuLibraryEnumerateKernels && d->cuKernelGetName) {
    unsigned int n = 0;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuLibraryGetKernelCount(&n, r.libraries.front()), "cuLibraryGetKernelCount"));
    std::vector<CUkernel> kernels(n);
    if (n) FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuLibraryEnumerateKernels(kernels.data(), n, r.libraries.front()), "cuLibraryEnumerateKernels"));
    for (CUkernel k : kernels) {
      const char* name = nullptr;
      FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuKernelGetName(&name, k), "cuKernelGetName"));
      names.emplace_back(name ? name : "");
    }
  } else if (!r.modules.empty() && d->cuModuleGetFunctionCount && d->cuModuleEnumerateFunctions) {
    unsigned int n = 0;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuModuleGetFunctionCount(&n, r.modules.front()), "cuModuleGetFunctionCount"));
    std::vector<CUfunction> funcs(n);
    if (n) FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuModuleEnumerateFunctions(funcs.data(), n, r.modules.front()), "cuModuleEnumerateFunctions"));
    for (CUfunction f : funcs) {
      const char* name = nullptr;
      FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuFuncGetName(&name, f), "cuFuncGetName"));
      names.emplace_back(name ? name : "");
    }
  } else {
    return Error(FOUNDRY_ERR_STATE, "image " + hash_name(r.hash) + " has no loaded handle to enumerate its kernels");
  }
  std::sort(names.begin(), names.end());
  r.entries = std::move(names);
  r.entries_known = true;
  return Status::Ok();
}

Status Registry::record_at(uint64_t index, foundry_image_record* out) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (index >= records_.size()) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "image index out of range");
  ImageRecord& r = *records_[index];
  ensure_hashed(r);
  Status entries = ensure_entries(r);
  if (!entries.ok()) LOG_DEBUG("entries of image %s unknown: %s", hash_name(r.hash).c_str(), entries.message().c_str());
  out->hash = r.hash;
  out->size = r.size;
  out->kind = r.kind;
  out->loader = static_cast<uint32_t>(r.loader);
  out->segments = static_cast<uint32_t>(r.segments.size());
  out->entry_count = static_cast<uint32_t>(r.entries.size());
  out->nvshmem = r.nvshmem > 0 ? 1 : 0;
  out->from_archive = r.from_archive ? 1 : 0;
  return Status::Ok();
}

ImageRecord* Registry::by_hash(uint64_t hash) {
  // The process's own loaded copy first, then an archived one with handles, then an archived one
  // not loaded yet, then any other. The process's own copy wins because its kernels' module state
  // (__device__ and __constant__ variables) is the one the process uses: restored graphs must use
  // it too. Two loaded copies exist only when the process loaded the image itself before, or while,
  // the archive's copy was loaded (LOAD may load the archive's images on a thread while the engine
  // loads its weights); every later load of the process gets the archive's handle (find_archived).
  ImageRecord* archived = nullptr;
  ImageRecord* lazy = nullptr;
  ImageRecord* fallback = nullptr;
  for (auto& r : records_) {
    ensure_hashed(*r);
    if (r->hash != hash || r->load_failed) continue;
    bool handles = !r->libraries.empty() || !r->modules.empty();
    if (handles && !r->from_archive) return r.get();
    if (handles) {
      if (archived == nullptr) archived = r.get();
    } else if (r->from_archive && !r->loaded) {
      lazy = r.get();
    } else {
      fallback = r.get();
    }
  }
  return archived != nullptr ? archived : lazy != nullptr ? lazy : fallback;
}

Result<std::string> Registry::entry_name(uint64_t hash, uint32_t i) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  ImageRecord* r = by_hash(hash);
  if (r == nullptr) return Error(FOUNDRY_ERR_NOT_FOUND, "no image " + hash_name(hash));
  FOUNDRY_RETURN_IF_ERROR(ensure_entries(*r));
  if (i >= r->entries.size()) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "entry index out of range");
  return r->entries[i];
}

ImageRecord* Registry::find_by_module(CUmodule mod) {
  auto it = by_module_.find(mod);
  if (it != by_module_.end()) return it->second;
  // Library modules are learnt lazily: asking for them can make the driver load the module, so
  // only libraries not asked before are visited.
  const Driver* d = driver_if_open();
  if (d == nullptr || d->cuLibraryGetModule == nullptr) return nullptr;
  for (auto& r : records_) {
    if (r->library_modules_known || r->libraries.empty()) continue;  // (an archived image read lazily: once loaded)
    for (CUlibrary lib : r->libraries) {
      CUmodule m = nullptr;
      if (d->cuLibraryGetModule(&m, lib) == CUDA_SUCCESS && m != nullptr) by_module_[m] = r.get();
    }
    r->library_modules_known = true;
  }
  it = by_module_.find(mod);
  return it == by_module_.end() ? nullptr : it->second;
}

Status Registry::lookup(CUfunction func, CUkernel kern, uint64_t* hash, std::string* name) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto drv = driver();
  if (!drv.ok()) return drv.status();
  const Driver* d = drv.value();
  const char* n = nullptr;
  ImageRecord* r = nullptr;
  if (kern != nullptr) {
    CUlibrary lib = nullptr;
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuKernelGetName(&n, kern), "cuKernelGetName"));
    if (d->cuKernelGetLibrary(&lib, kern) == CUDA_SUCCESS) {
      auto it = by_handle_.find(lib);
      if (it != by_handle_.end()) r = it->second;
    }
  }
  if (r == nullptr && func != nullptr) {
    if (n == nullptr) FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuFuncGetName(&n, func), "cuFuncGetName"));
    CUmodule mod = nullptr;
    if (d->cuFuncGetModule(&mod, func) == CUDA_SUCCESS) r = find_by_module(mod);
  }
  if (n == nullptr) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "kernel node has neither a function nor a kernel handle");
  if (r == nullptr) {
    return Error(FOUNDRY_ERR_NOT_FOUND, std::string("kernel '") + n +
                                            "' comes from an image Foundry did not see loaded (was the process started with "
                                            "the preload, e.g. `foundry run -- ...`?)");
  }
  ensure_hashed(*r);
  *hash = r->hash;
  *name = n;
  return Status::Ok();
}

Status Registry::check_entry(uint64_t hash, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  ImageRecord* r = by_hash(hash);
  if (r == nullptr) return Error(FOUNDRY_ERR_NOT_FOUND, "image " + hash_name(hash) + " is not loaded (is it in the archive?)");
  if (!r->entries_known) return Status::Ok();  // an image the process loaded itself: resolve() will tell
  if (!std::binary_search(r->entries.begin(), r->entries.end(), name)) {
    return Error(FOUNDRY_ERR_NOT_FOUND, "kernel '" + name + "' is not an entry of image " + hash_name(hash));
  }
  return Status::Ok();
}

Result<CUfunction> Registry::resolve(uint64_t hash, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  ImageRecord* r = by_hash(hash);
  if (r == nullptr) return Error(FOUNDRY_ERR_NOT_FOUND, "image " + hash_name(hash) + " is not loaded (is it in the archive?)");
  if (!r->loaded) FOUNDRY_RETURN_IF_ERROR(load_lazy_record(*r));
  auto cached = r->resolved.find(name);
  if (cached != r->resolved.end()) return cached->second;
  const Driver* d = driver_if_open();
  CUfunction f = nullptr;
  if (!r->libraries.empty()) {
    CUkernel k = nullptr;
    CUresult res = d->cuLibraryGetKernel(&k, r->libraries.front(), name.c_str());
    if (res == CUDA_SUCCESS) res = d->cuKernelGetFunction(&f, k);
    if (res != CUDA_SUCCESS) {
      return Error(FOUNDRY_ERR_NOT_FOUND, "kernel '" + name + "' not found in image " + hash_name(hash) + ": " +
                                              cuda_error(res, "cuLibraryGetKernel").message());
    }
  } else if (!r->modules.empty()) {
    CUresult res = d->cuModuleGetFunction(&f, r->modules.front(), name.c_str());
    if (res != CUDA_SUCCESS) {
      return Error(FOUNDRY_ERR_NOT_FOUND, "kernel '" + name + "' not found in image " + hash_name(hash) + ": " +
                                              cuda_error(res, "cuModuleGetFunction").message());
    }
  } else {
    return Error(FOUNDRY_ERR_STATE, "image " + hash_name(hash) + " was unloaded");
  }
  r->resolved[name] = f;
  return f;
}

// ---- packing ------------------------------------------------------------------------------

static Status make_dirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!partial.empty() && mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return Error(FOUNDRY_ERR_IO, "cannot create directory " + partial + ": " + std::strerror(errno));
      }
    }
    if (i < path.size()) partial += path[i];
  }
  return Status::Ok();
}

static int probe_nvshmem(const Driver* d, ImageRecord& r) {
  CUdeviceptr ptr;
  size_t bytes;
  if (!r.libraries.empty() && d->cuLibraryGetGlobal) {
    return d->cuLibraryGetGlobal(&ptr, &bytes, r.libraries.front(), kNvshmemProbe) == CUDA_SUCCESS ? 1 : 0;
  }
  if (!r.modules.empty() && d->cuModuleGetGlobal) {
    return d->cuModuleGetGlobal(&ptr, &bytes, r.modules.front(), kNvshmemProbe) == CUDA_SUCCESS ? 1 : 0;
  }
  return 0;
}

Status Registry::pack(const std::string& dir, const std::vector<uint64_t>& hashes, int arch) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto drv = driver();
  if (!drv.ok()) return drv.status();
  std::string images_dir = dir + "/images";
  FOUNDRY_RETURN_IF_ERROR(make_dirs(images_dir));
  for (uint64_t hash : hashes) {
    ImageRecord* r = by_hash(hash);
    if (r == nullptr) return Error(FOUNDRY_ERR_NOT_FOUND, "image " + hash_name(hash) + " is not in the registry");
    FOUNDRY_RETURN_IF_ERROR(ensure_entries(*r));
    if (r->nvshmem < 0) r->nvshmem = probe_nvshmem(drv.value(), *r);
    // Store only the device's cubin where the image is a plain fatbin that has one: smaller,
    // and the driver loads it without searching the fatbin.
    std::vector<uint8_t> cubin;
    if (arch > 0 && r->segments.size() == 1 &&
        (r->kind == FOUNDRY_IMAGE_FATBIN || r->kind == FOUNDRY_IMAGE_FATBIN_WRAPPER)) {
      auto extracted = extract_cubin(r->segments[0].first, r->segments[0].second, arch);
      if (extracted.ok()) cubin = std::move(extracted.value());
    }
    ByteWriter meta;
    meta.u32(kImageMetaVersion);
    meta.u64(r->hash);
    meta.u64(r->size);
    meta.u32(r->kind);
    meta.u32(static_cast<uint32_t>(r->loader));
    meta.u32(static_cast<uint32_t>(r->wrapper_version));
    meta.u32(cubin.empty() ? 0 : static_cast<uint32_t>(arch));
    meta.u32(static_cast<uint32_t>(r->nvshmem > 0));
    meta.u32(static_cast<uint32_t>(r->entries.size()));
    for (const std::string& e : r->entries) meta.string(e);
    ContainerWriter w;
    w.add(kSectionMeta, meta.take());
    if (!cubin.empty()) {
      w.add(kSectionSegment, std::move(cubin));
    } else {
      for (const auto& s : r->segments) w.add(kSectionSegment, std::vector<uint8_t>(s.first, s.first + s.second));
    }
    FOUNDRY_RETURN_IF_ERROR(write_container_file(images_dir + "/" + hash_name(r->hash) + kImageSuffix, w));
  }
  return Status::Ok();
}

// ---- loading ------------------------------------------------------------------------------

Result<std::unique_ptr<ImageRecord>> Registry::read_and_load(const std::string& path, bool lazy) {
  uint64_t named = 0;
  if (image_file_hash(path, &named)) {
    // Loaded (or, for a lazy read, read) from a file of this name before: that read checked the
    // content against the name, so the image is the same and need not be read again (a restore
    // after the images were loaded ahead reads none of them twice).
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (done_before(named, lazy)) return std::unique_ptr<ImageRecord>();
  }
  auto file = read_image_file(path);
  if (!file.ok()) return file.status();
  ImageFileInfo& info = file.value();
  auto r = std::make_unique<ImageRecord>();
  r->entries = std::move(info.entries);
  std::sort(r->entries.begin(), r->entries.end());  // check_entry searches them
  r->owned = std::move(info.segments);
  for (auto& o : r->owned) r->segments.emplace_back(o.data(), o.size());
  r->hash = info.hash;
  r->hashed = true;
  r->size = info.size;
  r->kind = info.kind;
  r->loader = static_cast<Loader>(info.loader);
  r->wrapper_version = static_cast<int>(info.wrapper_version);
  r->nvshmem = static_cast<int>(info.nvshmem);
  r->entries_known = true;
  r->from_archive = true;
  r->loaded = false;
  r->path = path;
  driver_if_open()->cuCtxGetCurrent(&r->ctx);
  {
    // Read before: nothing to do, unless this eager read finds it read lazily and not loaded yet.
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (done_before(r->hash, lazy)) return std::unique_ptr<ImageRecord>();
  }
  // Eager: the driver load runs outside the lock (a slow one must not hold up the process's own
  // loads on other threads); the record goes in only once loaded (commit).
  if (!lazy) FOUNDRY_RETURN_IF_ERROR(load_record(*r));
  return r;
}

bool Registry::commit(std::unique_ptr<ImageRecord> r, bool lazy) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (ImageRecord* before = archived_record(r->hash)) {  // read meanwhile, or read lazily before
    if (!lazy && !before->loaded) {
      adopt_handles(*before, *r);
      return true;  // loading a lazily read one counts as loading it
    }
    if (!lazy) unload_record(*r);
    return false;
  }
  if (!lazy) register_handles(*r);
  records_.push_back(std::move(r));
  ++archived_count_;
  return true;
}

bool Registry::done_before(uint64_t hash, bool lazy) {
  ImageRecord* before = archived_record(hash);
  return before != nullptr && (lazy || before->loaded);
}

ImageRecord* Registry::archived_record(uint64_t hash) {
  for (auto& existing : records_)
    if (existing->from_archive && !existing->load_failed && existing->hash == hash) return existing.get();
  return nullptr;
}

Status Registry::load_record(ImageRecord& rec) {
  ImageRecord* r = &rec;
  const std::string& path = r->path;
  const void* code = r->segments[0].first;
  if (r->segments.size() > 1) {
    // Several -rdc segments: hand the driver a wrapper like the one cudart registered.
    // Segment 0 is the wrapper's `data` (the device-linked fatbin), the rest its per-unit list.
    size_t n = r->segments.size() - 1;
    r->wrapper_storage.reset(new uint8_t[sizeof(FatbinWrapper) + (n + 1) * sizeof(void*)]);
    auto* w = reinterpret_cast<FatbinWrapper*>(r->wrapper_storage.get());
    auto** list = reinterpret_cast<const void**>(r->wrapper_storage.get() + sizeof(FatbinWrapper));
    for (size_t i = 0; i < n; ++i) list[i] = r->segments[i + 1].first;
    list[n] = nullptr;
    w->magic = kWrapperMagic;
    w->version = 2;
    w->data = reinterpret_cast<const unsigned long long*>(r->segments[0].first);
    w->filename_or_fatbins = static_cast<void*>(list);
    code = w;
  }
  const Driver* d = driver_if_open();
  if (r->loader == Loader::kLibrary) {  // a library is not bound to a context
    CUlibrary lib = nullptr;
    // The bytes stay alive in the record, so the driver need not keep its own copy.
    CUlibraryOption opt = CU_LIBRARY_BINARY_IS_PRESERVED;
    unsigned int one = 1;
    void* opt_value = reinterpret_cast<void*>(static_cast<uintptr_t>(one));
    FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuLibraryLoadData(&lib, code, nullptr, nullptr, 0, &opt, &opt_value, 1),
                                       ("cuLibraryLoadData of " + path).c_str()));
    r->libraries.push_back(lib);
  } else {
    // A module belongs to a context: LOAD's, also when a lazy record is loaded from another thread.
    CUcontext current = nullptr;
    d->cuCtxGetCurrent(&current);
    bool push = r->ctx != nullptr && r->ctx != current;
    if (push) FOUNDRY_RETURN_IF_ERROR(cuda_check(d->cuCtxPushCurrent(r->ctx), "cuCtxPushCurrent"));
    CUmodule mod = nullptr;
    CUresult res = d->cuModuleLoadData(&mod, code);
    if (push) d->cuCtxPopCurrent(&current);
    FOUNDRY_RETURN_IF_ERROR(cuda_check(res, ("cuModuleLoadData of " + path).c_str()));
    r->modules.push_back(mod);
  }
  r->loaded = true;
  return Status::Ok();
}

void Registry::register_handles(ImageRecord& r) {
  void* handle = r.loader == Loader::kLibrary ? static_cast<void*>(r.libraries.front()) : static_cast<void*>(r.modules.front());
  by_handle_[handle] = &r;
  if (r.loader == Loader::kModule) by_module_[r.modules.front()] = &r;
}

void Registry::adopt_handles(ImageRecord& into, ImageRecord& from) {
  into.modules = std::move(from.modules);
  into.libraries = std::move(from.libraries);
  into.wrapper_storage = std::move(from.wrapper_storage);
  into.owned.swap(from.owned);  // the bytes the driver was given stay with the handles
  into.segments.swap(from.segments);
  into.loaded = true;
  register_handles(into);
}

void Registry::unload_record(ImageRecord& r) {
  const Driver* d = driver_if_open();
  for (CUlibrary l : r.libraries) d->cuLibraryUnload(l);
  for (CUmodule m : r.modules) d->cuModuleUnload(m);
  r.libraries.clear();
  r.modules.clear();
}

Status Registry::load_lazy_record(ImageRecord& r) {
  Status s = load_record(r);
  if (s.ok()) {
    register_handles(r);
    return s;
  }
  r.load_failed = true;
  LOG_WARNING("archived image %s could not be loaded (%s); its kernels come from the process's own load, if any",
              hash_name(r.hash).c_str(), s.message().c_str());
  return s;
}

Result<uint64_t> Registry::load_dir(const std::string& dir, bool lazy) {
  FOUNDRY_RETURN_IF_ERROR(ensure_context());
  std::string images_dir = dir + "/images";
  DIR* dp = opendir(images_dir.c_str());
  if (dp == nullptr) return Error(FOUNDRY_ERR_NOT_FOUND, "no image directory " + images_dir + ": " + std::strerror(errno));
  std::vector<std::string> files;
  while (dirent* e = readdir(dp)) {
    std::string name = e->d_name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, kImageSuffix) == 0 && name[0] != '.') files.push_back(name);
  }
  closedir(dp);
  std::sort(files.begin(), files.end());
  const size_t threads = image_threads(files.size(), lazy);
  uint64_t loaded = 0;
  if (threads <= 1) {
    // One at a time, each registered as soon as it is loaded: the process's own load of the same
    // image on another thread then finds it (find_archived) instead of loading a second copy.
    for (const std::string& f : files) {
      auto r = read_and_load(images_dir + "/" + f, lazy);
      if (!r.ok()) return r.status();
      if (r.value() && commit(std::move(r.value()), lazy)) ++loaded;
    }
  } else {
    // On several threads, each into the caller's context; the records go in afterwards in file
    // order, so the registry's order does not depend on the threads. The first error in file
    // order is reported, as a serial load would, after the images before it went in; files after
    // it are not started, and those already loaded are unloaded again.
    CUcontext ctx = nullptr;
    driver_if_open()->cuCtxGetCurrent(&ctx);
    std::vector<std::unique_ptr<ImageRecord>> made(files.size());
    std::vector<Status> status(files.size(), Status::Ok());
    std::atomic<size_t> first_failed{files.size()};
    parallel_for(files.size(), threads, [&](size_t i) {
      if (i > first_failed.load()) return;
      Status s = cuda_check(driver_if_open()->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");  // a new thread has none
      if (s.ok()) {
        try {
          auto r = read_and_load(images_dir + "/" + files[i], lazy);
          if (r.ok()) made[i] = std::move(r.value());
          else s = r.status();
        } catch (const std::bad_alloc&) {
          s = Error(FOUNDRY_ERR_IO, images_dir + "/" + files[i] + ": out of memory reading the image");
        }
      }
      if (s.ok()) return;
      status[i] = s;
      // first_failed = min(first_failed, i), against other threads failing at the same time.
      for (size_t at = first_failed.load(); i < at && !first_failed.compare_exchange_weak(at, i);) {
      }
    });
    for (size_t i = 0; i < files.size(); ++i) {
      if (!status[i].ok()) {
        for (size_t j = i + 1; j < files.size(); ++j)
          if (made[j] && made[j]->loaded) unload_record(*made[j]);
        return status[i];
      }
      if (made[i] && commit(std::move(made[i]), lazy)) ++loaded;
    }
  }
  LOG_INFO("%s %" PRIu64 " kernel images from %s", lazy ? "read" : "loaded", loaded, images_dir.c_str());
  return loaded;
}

size_t Registry::image_threads(size_t files, bool lazy) {
  // Reading and checking is the process's own work: threads by the count. The driver serialises
  // module loads (scripts/image_load_probe.py: 8 threads 0.6-0.9x of one on an H200), so driver
  // loads get one thread unless FOUNDRY_IMAGE_THREADS asks for more.
  if (size_t asked = image_threads_setting()) return work_threads(asked);
  return lazy ? work_threads(files / kImagesPerThread) : 1;
}

Result<uint64_t> Registry::init_nvshmem() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  using ModuleInit = int (*)(CUmodule);
  using LibraryInit = int (*)(CUlibrary);
  auto module_init = reinterpret_cast<ModuleInit>(real_dlsym(RTLD_DEFAULT, "nvshmemx_cumodule_init"));
  auto library_init = reinterpret_cast<LibraryInit>(real_dlsym(RTLD_DEFAULT, "nvshmemx_culibrary_init"));
  uint64_t done = 0;
  for (auto& r : records_) {
    if (!r->from_archive || r->nvshmem <= 0 || r->load_failed) continue;
    if (!r->loaded) FOUNDRY_RETURN_IF_ERROR(load_lazy_record(*r));
    if (r->loader == Loader::kLibrary) {
      if (library_init == nullptr) return Error(FOUNDRY_ERR_NOT_FOUND, "an archived image needs NVSHMEM, but nvshmemx_culibrary_init is not loaded in this process");
      for (CUlibrary l : r->libraries) {
        if (library_init(l) != 0) return Error(FOUNDRY_ERR_STATE, "nvshmemx_culibrary_init failed (is NVSHMEM initialised yet?)");
      }
    } else {
      if (module_init == nullptr) return Error(FOUNDRY_ERR_NOT_FOUND, "an archived image needs NVSHMEM, but nvshmemx_cumodule_init is not loaded in this process");
      for (CUmodule m : r->modules) {
        if (module_init(m) != 0) return Error(FOUNDRY_ERR_STATE, "nvshmemx_cumodule_init failed (is NVSHMEM initialised yet?)");
      }
    }
    ++done;
  }
  return done;
}

}  // namespace foundry
