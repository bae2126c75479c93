// Every other function of the Driver table (driver/driver.h), which the core looks up in
// libcuda.so.1 when it opens it: a weak stub that says CUDA_ERROR_NOT_SUPPORTED. fake_cuda.cpp's
// functions are strong definitions and replace their stubs at link time, so the list is the
// table's own and a function added to the table needs nothing here.
#include "driver/driver.h"

// Exported under the symbol the table looks up: cuda.h's macros turn the public name into the
// versioned symbol (cuMemAlloc -> cuMemAlloc_v2), as they do for the table.
#define FAKE_STR2(x) #x
#define FAKE_STR(x) FAKE_STR2(x)
#define FAKE_STUB(name)                                                              \
  extern "C" __attribute__((weak)) CUresult fake_stub_##name() __asm__(FAKE_STR(name)); \
  CUresult fake_stub_##name() { return CUDA_ERROR_NOT_SUPPORTED; }

FOUNDRY_DRIVER_FUNCTIONS(FAKE_STUB)
