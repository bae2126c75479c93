// A minimal test harness for the native unit tests (ctest runs each test_*.cpp as a program).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace foundry_test {

struct Case {
  const char* name;
  std::function<void()> body;
};

inline std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}

inline int& failures() {
  static int n = 0;
  return n;
}

struct Register {
  Register(const char* name, std::function<void()> body) { cases().push_back({name, std::move(body)}); }
};

inline int run_all() {
  for (const Case& c : cases()) {
    int before = failures();
    c.body();
    std::printf("%s %s\n", failures() == before ? "PASS" : "FAIL", c.name);
  }
  std::printf("%zu cases, %d failed checks\n", cases().size(), failures());
  return failures() == 0 ? 0 : 1;
}

}  // namespace foundry_test

#define FT_CAT2(a, b) a##b
#define FT_CAT(a, b) FT_CAT2(a, b)
#define TEST_CASE(name)                                                             \
  static void FT_CAT(test_fn_, __LINE__)();                                         \
  static foundry_test::Register FT_CAT(test_reg_, __LINE__)(name, FT_CAT(test_fn_, __LINE__)); \
  static void FT_CAT(test_fn_, __LINE__)()

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++foundry_test::failures();                                                   \
    }                                                                               \
  } while (0)

#define CHECK_EQ(a, b) CHECK((a) == (b))

#define TEST_MAIN() \
  int main() { return foundry_test::run_all(); }
