// parallel_for: every index once, on the threads asked for, and an exception thrown by the work
// reaching the caller (as from the serial loop) instead of terminating the process.
#include <atomic>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "tests/check.h"

using namespace foundry;

TEST_CASE("every index runs exactly once, serially and on threads") {
  for (size_t threads : {size_t{1}, size_t{4}}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{100}}) {
      std::vector<std::atomic<int>> seen(n);
      parallel_for(n, threads, [&](size_t i) { seen[i].fetch_add(1); });
      for (size_t i = 0; i < n; ++i) CHECK_EQ(seen[i].load(), 1);
    }
  }
}

TEST_CASE("an exception thrown on a worker thread reaches the caller after every thread stopped") {
  for (size_t threads : {size_t{1}, size_t{4}}) {
    std::atomic<int> ran{0};
    std::string caught;
    try {
      parallel_for(1000, threads, [&](size_t i) {
        ran.fetch_add(1);
        if (i == 3) throw std::bad_alloc();
      });
    } catch (const std::bad_alloc&) {
      caught = "bad_alloc";
    }
    CHECK_EQ(caught, std::string("bad_alloc"));
    if (threads == 1) CHECK_EQ(ran.load(), 4);  // serially, nothing after the throw runs
  }
}

TEST_CASE("of several exceptions, one reaches the caller") {
  std::string caught;
  try {
    parallel_for(64, 4, [](size_t i) { throw std::runtime_error("index " + std::to_string(i)); });
  } catch (const std::runtime_error& e) {
    caught = e.what();
  }
  CHECK(caught.rfind("index ", 0) == 0);
}

TEST_MAIN()
