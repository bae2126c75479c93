// A small JSON value, parser and writer (RFC 8259) for the inspection tools.
//
// Why not a library: the native core has no third-party dependencies, and what it needs is small.
// What matters here:
//   - Integers stay exact: device addresses and hashes exceed 2^53, so a number written without a
//     fraction or exponent is kept as uint64 (non-negative) or int64 (negative). Only numbers
//     outside those ranges, or written with a fraction/exponent, become doubles.
//   - Parsing input that may be hostile never crashes: nesting is limited (the parser recurses),
//     strings must be valid UTF-8 without raw control characters, duplicate object keys are
//     refused, and errors name the byte offset where parsing stopped.
//   - Objects keep their members in insertion order, so dumps read in a stable, logical order.
//   - No exceptions are thrown (short of std::bad_alloc, which the C boundary catches).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace foundry {
namespace json {

constexpr size_t kDefaultMaxDepth = 64;

struct Member;

class Value {
 public:
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

  Value() = default;  // null
  static Value null() { return Value(); }
  static Value boolean(bool b);
  static Value u64(uint64_t v);
  static Value i64(int64_t v);  // stored as u64 when v >= 0, so equal integers compare equal
  static Value number(double v);
  static Value string(std::string s);
  static Value array();
  static Value object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Typed reads: false (and *out untouched) unless the value is of that type and, for integers,
  // exactly representable (a double never converts to an integer: "1.0" is not a count).
  bool get_bool(bool* out) const;
  bool get_u64(uint64_t* out) const;
  bool get_i64(int64_t* out) const;
  bool get_double(double* out) const;  // any number (integers converted, possibly rounded)
  // The string's bytes; empty for non-strings.
  const std::string& str() const { return string_; }

  // Array elements (empty for non-arrays). push() makes a null value an array first.
  const std::vector<Value>& items() const { return items_; }
  Value& push(Value v);

  // Object members in insertion order (empty for non-objects).
  const std::vector<Member>& members() const { return members_; }
  // The member named key, or null when absent (or this is not an object).
  const Value* find(const std::string& key) const;
  // Sets (replacing) the member named key; makes a null value an object first. Returns *this so
  // that dumps can be built fluently.
  Value& set(const std::string& key, Value v);
  // Appends a member without looking for an existing one (the caller knows the key is new):
  // keeps building large objects linear.
  Value& add(std::string key, Value v);

  // Describes the type for error messages ("an unsigned integer", "a string", ...).
  const char* type_name() const;

 private:
  enum class Num : uint8_t { kUint, kInt, kDouble };

  Type type_ = Type::kNull;
  Num num_ = Num::kUint;
  bool bool_ = false;
  uint64_t u_ = 0;
  int64_t i_ = 0;
  double d_ = 0;
  std::string string_;
  std::vector<Value> items_;
  std::vector<Member> members_;

  friend std::string dump_number(const Value& v);
};

struct Member {
  std::string key;
  Value value;
};

// Writes v as JSON. indent 0: compact, one line. indent > 0: pretty, nested containers on their
// own lines, except arrays holding only scalars, which stay on one line (grid: [1, 1, 1]).
// Strings are escaped; bytes that are not valid UTF-8 are written as U+FFFD.
std::string dump(const Value& v, int indent = 0);

// Parses one JSON document (surrounding whitespace allowed, nothing else after it).
// Errors: FOUNDRY_ERR_FORMAT "JSON: <why> at byte <offset>".
Result<Value> parse(const std::string& text, size_t max_depth = kDefaultMaxDepth);

}  // namespace json
}  // namespace foundry
