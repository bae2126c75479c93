// Foundry's handlers, exported under the driver's own names so that code linked against libcuda
// (e.g. Triton's launcher) binds to them under LD_PRELOAD, and handed out by the lookup paths.
#pragma once

#include <cuda.h>

#define FOUNDRY_EXPORT extern "C" __attribute__((visibility("default")))

// cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; the original (v1, no status out-param)
// is exported under its own name through an asm label.
FOUNDRY_EXPORT CUresult handler_cuGetProcAddress_v1(const char* symbol, void** pfn, int cudaVersion,
                                                     cuuint64_t flags) __asm__("cuGetProcAddress");
FOUNDRY_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus);
FOUNDRY_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize);
FOUNDRY_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                            unsigned int ElementSizeBytes);
FOUNDRY_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr);
FOUNDRY_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                             unsigned long long flags);
FOUNDRY_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
FOUNDRY_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname);
FOUNDRY_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image);
FOUNDRY_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                            CUjit_option* options, void** optionValues);
FOUNDRY_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin);
FOUNDRY_EXPORT CUresult cuModuleUnload(CUmodule hmod);
FOUNDRY_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                                           void** jitOptionsValues, unsigned int numJitOptions,
                                           CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                           unsigned int numLibraryOptions);
FOUNDRY_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option* jitOptions,
                                               void** jitOptionsValues, unsigned int numJitOptions,
                                               CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                               unsigned int numLibraryOptions);
FOUNDRY_EXPORT CUresult cuLibraryUnload(CUlibrary library);
// Cache preferences (no getter exists): recorded for SAVE, then passed to the driver.
FOUNDRY_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config);
FOUNDRY_EXPORT CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev);
