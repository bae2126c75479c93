// dlsym: the CUDA runtime finds cuGetProcAddress in libcuda with dlsym, so this is where the
// interposition starts (and where NCCL looked up by name is answered). Only symbols that would resolve into libcuda and that the table names are
// answered with a handler; every other lookup goes to glibc as a sibling call, so that glibc still
// sees the original caller (RTLD_NEXT is relative to the caller's object; a normal call from here
// would make it relative to libfoundry.so and break other interposers).
#include <dlfcn.h>

#include <cstring>

#include "driver/driver.h"
#include "intercept/handlers.h"
#include "intercept/table.h"

namespace {

bool from_libcuda(void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return false;
  const char* base = std::strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  return std::strncmp(base, "libcuda.so", 10) == 0;
}

__attribute__((noinline)) void* cuda_dlsym(void* handle, const char* name) {
  void* found = foundry::glibc_dlsym()(handle, name);
  if (found == nullptr || !from_libcuda(found)) return found;
  void* handler = foundry::handler_for_symbol(name);
  if (handler == nullptr) return found;
  foundry::count(foundry::kDlsymAnswers);
  return handler;
}

// NCCL looked up by name (vLLM's pynccl opens libnccl with ctypes): the interposed entry point,
// which then calls the function the lookup found.
__attribute__((noinline)) void* nccl_dlsym(void* handle, const char* name) {
  return foundry::nccl_handler_for_symbol(name, foundry::glibc_dlsym()(handle, name));
}

}  // namespace

FOUNDRY_EXPORT void* dlsym(void* handle, const char* name) {
  if (name[0] == 'c' && name[1] == 'u') return cuda_dlsym(handle, name);
  // Only lookups in an explicit library handle (ctypes): RTLD_NEXT / RTLD_DEFAULT lookups go to
  // glibc as they are, so another NCCL wrapper's RTLD_NEXT still finds what follows it.
  if (name[0] == 'n' && name[1] == 'c' && name[2] == 'c' && name[3] == 'l' && handle != RTLD_NEXT &&
      handle != RTLD_DEFAULT)
    return nccl_dlsym(handle, name);
  return foundry::glibc_dlsym()(handle, name);
}
