// The real CUDA driver, opened lazily. Foundry never links libcuda: the interposer must not pull
// it into processes that never use CUDA, and the library must load on machines without a driver.
// Every driver call Foundry itself makes goes through this table, never through the exported
// driver-named symbols (which are Foundry's own handlers).
#pragma once

#include <cuda.h>

#include <string>

#include "common/status.h"

// X(name): `name` is the public cuda.h name; cuda.h's macros turn it into the versioned symbol
// (cuMemAlloc -> cuMemAlloc_v2), which is also the name looked up in libcuda.
#define FOUNDRY_DRIVER_FUNCTIONS(X)                                                               \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)           \
  X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem)              \
  X(cuDeviceGetUuid) X(cuDevicePrimaryCtxRetain) X(cuCtxGetCurrent) X(cuCtxSetCurrent)            \
  X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuGetProcAddress)                                       \
  X(cuMemAlloc) X(cuMemAllocPitch) X(cuMemFree) X(cuMemAddressReserve) X(cuMemAddressFree)        \
  X(cuMemCreate) X(cuMemMap) X(cuMemUnmap) X(cuMemRelease) X(cuMemSetAccess)                      \
  X(cuMemGetAllocationGranularity) X(cuPointerGetAttribute) X(cuMemcpyDtoH) X(cuMemGetAddressRange) \
  X(cuModuleLoad) X(cuModuleLoadData) X(cuModuleLoadDataEx) X(cuModuleLoadFatBinary)              \
  X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetFunctionCount)                            \
  X(cuModuleEnumerateFunctions) X(cuModuleGetGlobal) X(cuLibraryLoadData) X(cuLibraryLoadFromFile) \
  X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuLibraryGetKernelCount) X(cuLibraryEnumerateKernels) \
  X(cuLibraryGetModule) X(cuLibraryGetGlobal) X(cuKernelGetName) X(cuKernelGetLibrary)            \
  X(cuKernelGetFunction) X(cuKernelGetParamInfo) X(cuKernelGetAttribute) X(cuKernelSetAttribute)  \
  X(cuFuncGetName) X(cuFuncGetModule) X(cuFuncGetParamInfo) X(cuFuncGetAttribute)                \
  X(cuFuncSetAttribute) X(cuFuncLoad) X(cuFuncIsLoaded) X(cuFuncSetCacheConfig)                  \
  X(cuKernelSetCacheConfig)                                                                       \
  X(cuGraphCreate) X(cuGraphDestroy) X(cuGraphGetNodes) X(cuGraphGetEdges) X(cuGraphNodeGetType)  \
  X(cuGraphKernelNodeGetParams) X(cuGraphKernelNodeGetAttribute) X(cuGraphKernelNodeSetAttribute) \
  X(cuGraphMemsetNodeGetParams) X(cuGraphMemcpyNodeGetParams) X(cuGraphEventRecordNodeGetEvent)   \
  X(cuGraphEventWaitNodeGetEvent) X(cuGraphChildGraphNodeGetGraph) X(cuGraphAddNode)              \
  X(cuGraphAddDependencies) X(cuGraphInstantiateWithFlags) X(cuGraphExecDestroy) X(cuGraphLaunch) \
  X(cuGraphUpload) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuStreamSynchronize)     \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuGraphExecKernelNodeSetParams) X(cuGraphNodeGetDependencies)     \
  X(cuGraphAddKernelNode) X(cuGraphAddMemsetNode) X(cuGraphAddMemcpyNode) X(cuGraphAddEventRecordNode)    \
  X(cuGraphAddEventWaitNode) X(cuGraphAddEmptyNode) X(cuGraphAddChildGraphNode) X(cuGraphClone)           \
  X(cuGraphExecMemsetNodeSetParams) X(cuGraphExecMemcpyNodeSetParams) X(cuGraphExecEventRecordNodeSetEvent) \
  X(cuGraphExecEventWaitNodeSetEvent) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuGraphNodeFindInClone)   \
  X(cuStreamGetCaptureInfo) X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphKernelNodeSetParams)  \
  X(cuGraphKernelNodeCopyAttributes) X(cuGraphMemsetNodeSetParams) X(cuGraphMemcpyNodeSetParams)           \
  X(cuGraphEventRecordNodeSetEvent) X(cuGraphEventWaitNodeSetEvent) X(cuGraphExecGetFlags)

namespace foundry {

struct Driver {
#define FOUNDRY_DRIVER_SLOT(name) decltype(&::name) name = nullptr;
  FOUNDRY_DRIVER_FUNCTIONS(FOUNDRY_DRIVER_SLOT)
#undef FOUNDRY_DRIVER_SLOT
  void* handle = nullptr;
  int version = 0;
};

// glibc's own dlsym, never the interposed one (see intercept/dlsym.cpp).
using DlsymFn = void* (*)(void*, const char*);
DlsymFn glibc_dlsym();
void* real_dlsym(void* handle, const char* name);

// The driver, opened and initialised on first use (thread-safe). Fails with FOUNDRY_ERR_NO_DRIVER
// on a machine without libcuda.so.1 and FOUNDRY_ERR_CUDA when cuInit fails (e.g. no GPU).
Result<const Driver*> driver();
// The driver when it is already open, else nullptr; never opens it.
const Driver* driver_if_open();
// Opens libcuda without cuInit: for handlers that are called by code already using the driver.
const Driver* driver_for_handlers();

// A Status for a failed driver call: "cuMemMap failed: CUDA_ERROR_INVALID_VALUE (invalid argument)".
Status cuda_error(CUresult result, const char* call);
inline Status cuda_check(CUresult result, const char* call) {
  return result == CUDA_SUCCESS ? Status::Ok() : cuda_error(result, call);
}

// Makes sure a context is current on this thread: the current one, else the primary context of
// the device in FOUNDRY_DEVICE (default 0), as the CUDA runtime itself would use.
Status ensure_context();
Result<CUdevice> current_device();

}  // namespace foundry
