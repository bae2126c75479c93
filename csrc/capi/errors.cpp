#include "capi/errors.h"

#include <string>

namespace foundry {
namespace {
// Per thread, like errno: a message belongs to the call that failed on this thread.
thread_local std::string last_error_message;
}  // namespace

void set_last_error(const Status& s) { last_error_message = s.message(); }

foundry_status report(const Status& s) {
  if (!s.ok()) set_last_error(s);
  return s.code();
}

}  // namespace foundry

extern "C" const char* foundry_last_error(void) { return foundry::last_error_message.c_str(); }
