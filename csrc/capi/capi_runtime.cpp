// C boundary: version, diagnostics, logging and strict mode.
#include <cstring>

#include "capi/errors.h"
#include "capi/foundry.h"
#include "common/log.h"
#include "common/strict.h"
#include "driver/driver.h"
#include "intercept/table.h"

using namespace foundry;

#ifndef FOUNDRY_VERSION_STRING
#define FOUNDRY_VERSION_STRING "0.1.0"
#endif

extern "C" {

const char* foundry_version(void) { return FOUNDRY_VERSION_STRING; }

int foundry_preload_active(void) { return preload_active() ? 1 : 0; }

int64_t foundry_intercept_counter(int index) { return counter(index); }

foundry_status foundry_driver_version(int* version) {
  if (version == nullptr) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "version is NULL"));
  auto d = driver();
  if (!d.ok()) return report(d.status());
  *version = d.value()->version;
  return FOUNDRY_OK;
}

foundry_status foundry_device_info(int device, char* name, size_t name_len, int* cc_major, int* cc_minor,
                                   uint64_t* total_mem) {
  auto d = driver();
  if (!d.ok()) return report(d.status());
  const Driver* drv = d.value();
  CUdevice dev;
  Status s = cuda_check(drv->cuDeviceGet(&dev, device), "cuDeviceGet");
  if (!s.ok()) return report(s);
  if (name && name_len) {
    s = cuda_check(drv->cuDeviceGetName(name, static_cast<int>(name_len), dev), "cuDeviceGetName");
    if (!s.ok()) return report(s);
  }
  if (cc_major) drv->cuDeviceGetAttribute(cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  if (cc_minor) drv->cuDeviceGetAttribute(cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  if (total_mem) {
    size_t bytes = 0;
    drv->cuDeviceTotalMem(&bytes, dev);
    *total_mem = bytes;
  }
  return FOUNDRY_OK;
}

void foundry_set_log_level(int level) {
  if (level < 0) level = 0;
  if (level > 3) level = 3;
  set_log_level(static_cast<LogLevel>(level));
}

void foundry_set_strict(int strict) { set_strict_mode(strict != 0); }
int foundry_get_strict(void) { return strict_mode() ? 1 : 0; }

}  // extern "C"
