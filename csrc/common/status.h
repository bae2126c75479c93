// Errors as values: every fallible native operation returns a Status (or Result<T>).
// The C boundary turns them into foundry_status codes plus a per-thread message.
#pragma once

#include <string>
#include <utility>

#include "capi/foundry.h"

namespace foundry {

class Status {
 public:
  Status() = default;
  Status(foundry_status code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == FOUNDRY_OK; }
  foundry_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  foundry_status code_ = FOUNDRY_OK;
  std::string message_;
};

inline Status Error(foundry_status code, std::string message) { return Status(code, std::move(message)); }

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() { return value_; }
  const T& value() const { return value_; }

 private:
  Status status_;
  T value_{};
};

}  // namespace foundry

#define FOUNDRY_RETURN_IF_ERROR(expr)          \
  do {                                          \
    ::foundry::Status _st = (expr);             \
    if (!_st.ok()) return _st;                  \
  } while (0)
