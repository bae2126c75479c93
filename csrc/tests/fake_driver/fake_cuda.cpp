// A fake libcuda.so.1 for the native tests that drive the driver without a GPU, deterministically:
// the kernel-image registry's archive loading (test_registry_load) and the exec-memory warm-up's
// stand-in graphs (test_exec_warmup). CMake builds it only with the
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
//  - graphs as node counts, execs as the node count of their graph when instantiated; live graphs
//    and execs are counted (leaks), as is the largest number of execs alive at once, and an
//    instantiation can be made to fail (the driver out of memory).
// Every other function of the Driver table is a weak stub that fails (fake_stubs.cpp), there only
// so that the table resolves. The fake_* functions are the tests' controls.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
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
std::map<CUgraph, uint64_t> graphs;          // graph -> nodes; guarded by mu
std::map<CUgraphExec, uint64_t> execs;       // exec -> nodes of its graph when made; guarded by mu
std::vector<uint64_t> exec_sizes;            // every exec made, in order; guarded by mu
size_t most_execs = 0;                       // guarded by mu
long instantiations_left = -1;               // fail once this reaches 0; -1: never; guarded by mu
unsigned long long last_flags = 0;            // of the last instantiation; guarded by mu
uintptr_t next_handle = 0x100000;            // guarded by mu

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

CUresult CUDAAPI cuGraphCreate(CUgraph* graph, unsigned int) {
  std::lock_guard<std::mutex> lock(mu);
  *graph = reinterpret_cast<CUgraph>(next_handle += 16);
  graphs[*graph] = 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph graph) {
  std::lock_guard<std::mutex> lock(mu);
  return graphs.erase(graph) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

// A node needs a function of a loaded module (cuModuleGetFunction's: module + 1) and its
// parameters; the dependencies are not modelled.
CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode* node, CUgraph graph, const CUgraphNode*, size_t,
                                      const CUDA_KERNEL_NODE_PARAMS* p) {
  std::lock_guard<std::mutex> lock(mu);
  auto g = graphs.find(graph);
  if (g == graphs.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto module = reinterpret_cast<CUmodule>(reinterpret_cast<uintptr_t>(p->func) - 1);
  if (p->func == nullptr || live.count(module) == 0 || p->kernelParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ++g->second;
  *node = reinterpret_cast<CUgraphNode>(next_handle += 16);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  std::lock_guard<std::mutex> lock(mu);
  last_flags = flags;
  auto g = graphs.find(graph);
  if (g == graphs.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (instantiations_left == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (instantiations_left > 0) --instantiations_left;
  *exec = reinterpret_cast<CUgraphExec>(next_handle += 16);
  execs[*exec] = g->second;
  exec_sizes.push_back(g->second);
  most_execs = std::max(most_execs, execs.size());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec exec) {
  std::lock_guard<std::mutex> lock(mu);
  return execs.erase(exec) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
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
// Forgets the execs made so far and the most alive at once; the next `n` instantiations succeed
// and the one after fails (n < 0: none fails).
void fake_reset_graphs(long n) {
  std::lock_guard<std::mutex> lock(mu);
  exec_sizes.clear();
  most_execs = 0;
  instantiations_left = n;
}
// The node count of each exec made since the reset, in order; how many fit in `out` are copied.
size_t fake_exec_sizes(uint64_t* out, size_t cap) {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < exec_sizes.size() && i < cap; ++i) out[i] = exec_sizes[i];
  return exec_sizes.size();
}
// The flags of the last cuGraphInstantiateWithFlags call.
unsigned long long fake_last_instantiate_flags() {
  std::lock_guard<std::mutex> lock(mu);
  return last_flags;
}
size_t fake_most_live_execs() {
  std::lock_guard<std::mutex> lock(mu);
  return most_execs;
}
long fake_live_graphs_and_execs() {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<long>(graphs.size() + execs.size());
}
long fake_live_modules() {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<long>(live.size());
}

}  // extern "C"
