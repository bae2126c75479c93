#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <system_error>
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
  std::atomic<size_t> next{0};
  auto drain = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) work(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(drain);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the ones running (this one at least) do the rest
    }
  }
  drain();
  for (std::thread& t : pool) t.join();
}

}  // namespace foundry
