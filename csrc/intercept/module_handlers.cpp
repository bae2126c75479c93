// Image-load entry points: every image is recorded in the registry; at LOAD, a load of an image
// identical to an archived one returns the archived handle instead of a second copy.
#include "common/log.h"
#include "driver/driver.h"
#include "intercept/handlers.h"
#include "intercept/table.h"
#include "modules/cache_configs.h"
#include "modules/registry.h"

using foundry::Loader;
using foundry::PendingImage;
using foundry::Registry;

namespace {

const foundry::Driver* real() { return foundry::driver_for_handlers(); }

template <typename Handle, typename LoadFn>
CUresult load_through_registry(Handle* out, PendingImage pending, Loader loader, LoadFn&& load) {
  foundry::count(foundry::kImageLoadsSeen);
  Registry& reg = Registry::instance();
  void* existing = nullptr;
  if (out != nullptr && reg.find_archived(pending, loader, &existing)) {
    *out = static_cast<Handle>(existing);
    return CUDA_SUCCESS;
  }
  CUresult r = load();
  if (r == CUDA_SUCCESS && out != nullptr && pending.parsed) reg.add(std::move(pending), loader, *out);
  return r;
}

}  // namespace

FOUNDRY_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  PendingImage p = fname ? Registry::instance().inspect_file(fname) : PendingImage{};
  return load_through_registry(module, std::move(p), Loader::kModule, [&] { return real()->cuModuleLoad(module, fname); });
}

FOUNDRY_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  PendingImage p = Registry::instance().inspect(image, true);
  return load_through_registry(module, std::move(p), Loader::kModule, [&] { return real()->cuModuleLoadData(module, image); });
}

FOUNDRY_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                            CUjit_option* options, void** optionValues) {
  PendingImage p = Registry::instance().inspect(image, true);
  return load_through_registry(module, std::move(p), Loader::kModule, [&] {
    return real()->cuModuleLoadDataEx(module, image, numOptions, options, optionValues);
  });
}

FOUNDRY_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  PendingImage p = Registry::instance().inspect(fatCubin, true);
  return load_through_registry(module, std::move(p), Loader::kModule,
                               [&] { return real()->cuModuleLoadFatBinary(module, fatCubin); });
}

FOUNDRY_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  Registry& reg = Registry::instance();
  // Archived modules are shared with restored graphs: they live as long as the process.
  if (reg.is_archived_handle(hmod, Loader::kModule)) return CUDA_SUCCESS;
  CUresult r = real()->cuModuleUnload(hmod);
  if (r == CUDA_SUCCESS) {
    reg.forget_handle(hmod, Loader::kModule);
    foundry::CacheConfigLog::instance().forget_owner(hmod);
  }
  return r;
}

FOUNDRY_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                                           void** jitOptionsValues, unsigned int numJitOptions,
                                           CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                           unsigned int numLibraryOptions) {
  PendingImage p = Registry::instance().inspect(code, true);
  return load_through_registry(library, std::move(p), Loader::kLibrary, [&] {
    return real()->cuLibraryLoadData(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                                     libraryOptionValues, numLibraryOptions);
  });
}

FOUNDRY_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option* jitOptions,
                                               void** jitOptionsValues, unsigned int numJitOptions,
                                               CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                               unsigned int numLibraryOptions) {
  PendingImage p = fileName ? Registry::instance().inspect_file(fileName) : PendingImage{};
  return load_through_registry(library, std::move(p), Loader::kLibrary, [&] {
    return real()->cuLibraryLoadFromFile(library, fileName, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                                         libraryOptionValues, numLibraryOptions);
  });
}

FOUNDRY_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  Registry& reg = Registry::instance();
  if (reg.is_archived_handle(library, Loader::kLibrary)) return CUDA_SUCCESS;
  // The library's functions were noted under its module in this context (cuFuncGetModule):
  // that module goes with the library, so its notes must go too.
  CUmodule module = nullptr;
  if (real()->cuLibraryGetModule(&module, library) != CUDA_SUCCESS) module = nullptr;
  CUresult r = real()->cuLibraryUnload(library);
  if (r == CUDA_SUCCESS) {
    reg.forget_handle(library, Loader::kLibrary);
    foundry::CacheConfigLog::instance().forget_owner(library);
    foundry::CacheConfigLog::instance().forget_owner(module);
  }
  return r;
}
