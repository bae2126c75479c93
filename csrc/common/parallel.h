// Running independent pieces of work (sections of a file: checksums, decoding) on a few threads.
#pragma once

#include <cstddef>
#include <functional>

namespace foundry {

// The most threads a reader uses for one file.
constexpr size_t kMaxWorkThreads = 8;

// `wanted` threads, at most the machine's hardware threads and kMaxWorkThreads (at least 1).
size_t work_threads(size_t wanted);

// Runs work(i) for every i < n, each index exactly once, on `threads` threads (the calling thread
// is one of them; each takes the next index when it finishes one) and returns when all are done.
// Fewer threads run when the system cannot start that many. The first exception work() throws is
// rethrown here once every thread has stopped (indices not yet started are then skipped).
// With threads <= 1 or n <= 1: in index order on the calling thread.
void parallel_for(size_t n, size_t threads, const std::function<void(size_t)>& work);

}  // namespace foundry
