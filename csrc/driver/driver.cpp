#include "driver/driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "common/log.h"

#define FOUNDRY_STR2(x) #x
#define FOUNDRY_STR(x) FOUNDRY_STR2(x)

namespace foundry {
namespace {

DlsymFn resolve_glibc_dlsym() {
  // dlvsym is not interposed, so it reaches glibc's dlsym directly. glibc 2.34 moved dlsym into
  // libc with a new version; older ones only have the x86-64 base version.
  void* fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (fn == nullptr) fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (fn == nullptr) fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");  // aarch64 base version
  return reinterpret_cast<DlsymFn>(fn);
}

struct DriverState {
  std::once_flag open_once;
  std::once_flag init_once;
  Driver table;
  Status open_status;
  Status init_status;
};

DriverState& state() {
  static DriverState* s = new DriverState();  // never destroyed: handlers may run during exit
  return *s;
}

void open_library(DriverState& s) {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    s.open_status = Error(FOUNDRY_ERR_NO_DRIVER,
                          std::string("cannot load libcuda.so.1 (no NVIDIA driver on this machine?): ") +
                              (why ? why : "unknown dlopen error"));
    return;
  }
  s.table.handle = handle;
#define FOUNDRY_DRIVER_RESOLVE(name) \
  s.table.name = reinterpret_cast<decltype(&::name)>(real_dlsym(handle, FOUNDRY_STR(name)));
  FOUNDRY_DRIVER_FUNCTIONS(FOUNDRY_DRIVER_RESOLVE)
#undef FOUNDRY_DRIVER_RESOLVE
  std::string missing;
#define FOUNDRY_DRIVER_CHECK(name) \
  if (s.table.name == nullptr) missing += std::string(missing.empty() ? "" : ", ") + FOUNDRY_STR(name);
  FOUNDRY_DRIVER_FUNCTIONS(FOUNDRY_DRIVER_CHECK)
#undef FOUNDRY_DRIVER_CHECK
  if (!missing.empty()) {
    s.open_status = Error(FOUNDRY_ERR_NO_DRIVER, "the NVIDIA driver is too old for Foundry (it needs a CUDA 12.4 or newer "
                                                 "driver); libcuda.so.1 lacks " + missing);
  }
}

}  // namespace

DlsymFn glibc_dlsym() {
  static DlsymFn fn = resolve_glibc_dlsym();
  return fn;
}

void* real_dlsym(void* handle, const char* name) {
  DlsymFn fn = glibc_dlsym();
  return fn ? fn(handle, name) : nullptr;
}

const Driver* driver_for_handlers() {
  DriverState& s = state();
  std::call_once(s.open_once, [&s] { open_library(s); });
  return s.open_status.ok() ? &s.table : nullptr;
}

const Driver* driver_if_open() {
  DriverState& s = state();
  return s.table.handle != nullptr && s.open_status.ok() ? &s.table : nullptr;
}

Result<const Driver*> driver() {
  DriverState& s = state();
  std::call_once(s.open_once, [&s] { open_library(s); });
  if (!s.open_status.ok()) return s.open_status;
  std::call_once(s.init_once, [&s] {
    CUresult r = s.table.cuInit(0);
    if (r != CUDA_SUCCESS) {
      s.init_status = cuda_error(r, "cuInit");
      return;
    }
    s.table.cuDriverGetVersion(&s.table.version);
  });
  if (!s.init_status.ok()) return s.init_status;
  return static_cast<const Driver*>(&s.table);
}

Status cuda_error(CUresult result, const char* call) {
  const char* name = nullptr;
  const char* text = nullptr;
  const Driver* d = driver_if_open();
  if (d && d->cuGetErrorName) d->cuGetErrorName(result, &name);
  if (d && d->cuGetErrorString) d->cuGetErrorString(result, &text);
  std::string msg = std::string(call) + " failed: " + (name ? name : "CUresult " + std::to_string(result));
  if (text) msg += std::string(" (") + text + ")";
  return Error(FOUNDRY_ERR_CUDA, msg);
}

Status ensure_context() {
  auto d = driver();
  if (!d.ok()) return d.status();
  const Driver* drv = d.value();
  CUcontext ctx = nullptr;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(drv->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (ctx != nullptr) return Status::Ok();
  const char* env = std::getenv("FOUNDRY_DEVICE");
  int ordinal = env ? std::atoi(env) : 0;
  CUdevice dev;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(drv->cuDeviceGet(&dev, ordinal), "cuDeviceGet"));
  FOUNDRY_RETURN_IF_ERROR(cuda_check(drv->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
  FOUNDRY_RETURN_IF_ERROR(cuda_check(drv->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
  LOG_DEBUG("made the primary context of device %d current", ordinal);
  return Status::Ok();
}

Result<CUdevice> current_device() {
  FOUNDRY_RETURN_IF_ERROR(ensure_context());
  CUdevice dev;
  FOUNDRY_RETURN_IF_ERROR(cuda_check(driver_if_open()->cuCtxGetDevice(&dev), "cuCtxGetDevice"));
  return dev;
}

}  // namespace foundry
