// A fake libcuda.so.1 for the native tests of the kernel-image registry (test_registry_load): the
// registry's archive loading driven without a GPU, deterministically. CMake builds it only with the
// tests, alone in its own directory under this name, and ctest puts that directory first on
// LD_LIBRARY_PATH, so the core's dlopen("libcuda.so.1") opens it. It is never installed.
//
// It models only what loading depends on:
//  - a current context per thread, and none on a new thread: a test sees which context each module
//    went into (the registry must load into LOAD's context from its worker threads too);
//  - module handles kept while loaded: a test sees duplicates and leaks, and a function of an
//    unloaded module is refused;
//  - a test image's text says what the fake does with it: one starting "FAIL" is refused, as the
//    driver refuses a bad image; one with "PAIR" after the first five bytes ("FAIL PAIR ...",
//    "OKAY PAIR ...": every test image is longer than nine bytes) is held at a rendezvous with another such load, so that a test knows that
//    two of the registry's threads loaded at once, whatever the scheduler does (the calling thread
//    alone could otherwise take every file).
// Every other function of the Driver table is a weak stub that fails (fake_stubs.cpp), there only
// so that the table resolves. The fake_* functions are the tests' controls.
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

namespace {

thread_local CUcontext current = nullptr;
thread_local std::vector<CUcontext> pushed;
std::atomic<CUcontext> expected{nullptr};
std::atomic<long> loads{0};
std::atomic<long> wrong_context_loads{0};
std::mutex mu;
std::set<CUmodule> live;        // guarded by mu
uintptr_t next_module = 0x1000;  // guarded by mu
std::condition_variable all_arrived;
int awaited = 0;  // loads the rendezvous waits for, 0 when none is set; guarded by mu
int arrived = 0;  // guarded by mu
bool met = false;  // guarded by mu

// Holds a "PAIR" load until `awaited` of them are under way together (so on as many threads).
void rendezvous() {
  std::unique_lock<std::mutex> lock(mu);
  if (awaited == 0) return;
  if (++arrived < awaited) {
    // Bounded only so that a broken test fails instead of hanging: the rendezvous is then not met.
    if (!all_arrived.wait_for(lock, std::chrono::seconds(10), [] { return awaited == 0; })) awaited = 0;
    return;
  }
  met = true;
  awaited = 0;
  all_arrived.notify_all();
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuInit(unsigned int) { return CUDA_SUCCESS; }

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = current;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  current = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
  pushed.push_back(current);
  current = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext* ctx) {
  if (pushed.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx != nullptr) *ctx = current;
  current = pushed.back();
  pushed.pop_back();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  ++loads;
  if (expected.load() != nullptr && current != expected.load()) ++wrong_context_loads;
  if (std::memcmp(static_cast<const char*>(image) + 5, "PAIR", 4) == 0) rendezvous();
  if (std::memcmp(image, "FAIL", 4) == 0) return CUDA_ERROR_INVALID_IMAGE;
  std::lock_guard<std::mutex> lock(mu);
  *module = reinterpret_cast<CUmodule>(next_module += 16);
  live.insert(*module);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleUnload(CUmodule module) {
  std::lock_guard<std::mutex> lock(mu);
  return live.erase(module) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

// One function per module (whatever the name): a test tells whose module a resolved function is.
CUresult CUDAAPI cuModuleGetFunction(CUfunction* func, CUmodule module, const char*) {
  std::lock_guard<std::mutex> lock(mu);
  if (live.count(module) == 0) return CUDA_ERROR_INVALID_HANDLE;
  *func = reinterpret_cast<CUfunction>(reinterpret_cast<uintptr_t>(module) + 1);
  return CUDA_SUCCESS;
}

// ---- controls -----------------------------------------------------------------------------

// From now on, a module load made with another context current is counted as wrong.
void fake_expect_context(CUcontext ctx) { expected = ctx; }
long fake_wrong_context_loads() { return wrong_context_loads; }
// cuModuleLoadData calls, refused ones included.
long fake_loads() { return loads; }
// The next `n` "PAIR" loads wait for each other; met: they did.
void fake_rendezvous(int n) {
  std::lock_guard<std::mutex> lock(mu);
  awaited = n;
  arrived = 0;
  met = false;
}
bool fake_rendezvous_met() {
  std::lock_guard<std::mutex> lock(mu);
  return met;
}
long fake_live_modules() {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<long>(live.size());
}

}  // extern "C"
