#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace foundry {

size_t work_threads(size_t wanted) {
  size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  return std::max<size_t>(1, std::min({wanted, hardware, kMaxWorkThreads}));
}

void parallel_for(size_t n, size_t threads, const std::function<void(size_t)>& work) {
  threads = std::min(threads, n);
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) work(i);
    return;
  }
  // An exception must reach the caller as it would from the serial loop (an allocation failure
  // on a huge or hostile file becomes a status there), not terminate the process from a thread:
  // the first one thrown is kept, the rest of the work is skipped, every thread is joined, then
  // it is rethrown here.
  std::atomic<size_t> next{0};
  std::mutex failed_mu;
  std::exception_ptr failed;
  auto drain = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < n;) work(i);
    } catch (...) {
      next.store(n);
      std::lock_guard<std::mutex> lock(failed_mu);
      if (!failed) failed = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  try {
    pool.reserve(threads - 1);
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(drain);
  } catch (...) {
    // No more threads to be had (system_error, bad_alloc): the ones running, this one at least,
    // do the rest.
  }
  drain();
  for (std::thread& t : pool) t.join();
  if (failed) std::rethrow_exception(failed);
}

}  // namespace foundry
