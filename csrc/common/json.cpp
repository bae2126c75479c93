#include "common/json.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>
#include <utility>

namespace foundry {
namespace json {

// ---- Value ----------------------------------------------------------------------------------

Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

Value Value::u64(uint64_t x) {
  Value v;
  v.type_ = Type::kNumber;
  v.num_ = Num::kUint;
  v.u_ = x;
  return v;
}

Value Value::i64(int64_t x) {
  if (x >= 0) return u64(static_cast<uint64_t>(x));
  Value v;
  v.type_ = Type::kNumber;
  v.num_ = Num::kInt;
  v.i_ = x;
  return v;
}

Value Value::number(double x) {
  Value v;
  v.type_ = Type::kNumber;
  v.num_ = Num::kDouble;
  v.d_ = x;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}

Value Value::array() {
  Value v;
  v.type_ = Type::kArray;
  return v;
}

Value Value::object() {
  Value v;
  v.type_ = Type::kObject;
  return v;
}

bool Value::get_bool(bool* out) const {
  if (type_ != Type::kBool) return false;
  *out = bool_;
  return true;
}

bool Value::get_u64(uint64_t* out) const {
  if (type_ != Type::kNumber || num_ != Num::kUint) return false;
  *out = u_;
  return true;
}

bool Value::get_i64(int64_t* out) const {
  if (type_ != Type::kNumber) return false;
  if (num_ == Num::kInt) {
    *out = i_;
    return true;
  }
  if (num_ == Num::kUint && u_ <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    *out = static_cast<int64_t>(u_);
    return true;
  }
  return false;
}

bool Value::get_double(double* out) const {
  if (type_ != Type::kNumber) return false;
  switch (num_) {
    case Num::kUint: *out = static_cast<double>(u_); break;
    case Num::kInt: *out = static_cast<double>(i_); break;
    case Num::kDouble: *out = d_; break;
  }
  return true;
}

Value& Value::push(Value v) {
  if (type_ == Type::kNull) type_ = Type::kArray;
  items_.push_back(std::move(v));
  return items_.back();
}

const Value* Value::find(const std::string& key) const {
  for (const Member& m : members_)
    if (m.key == key) return &m.value;
  return nullptr;
}

Value& Value::set(const std::string& key, Value v) {
  if (type_ == Type::kNull) type_ = Type::kObject;
  for (Member& m : members_) {
    if (m.key == key) {
      m.value = std::move(v);
      return *this;
    }
  }
  members_.push_back(Member{key, std::move(v)});
  return *this;
}

Value& Value::add(std::string key, Value v) {
  if (type_ == Type::kNull) type_ = Type::kObject;
  members_.push_back(Member{std::move(key), std::move(v)});
  return *this;
}

const char* Value::type_name() const {
  switch (type_) {
    case Type::kNull: return "null";
    case Type::kBool: return "a boolean";
    case Type::kNumber:
      return num_ == Num::kUint ? "an unsigned integer" : num_ == Num::kInt ? "a negative integer" : "a number";
    case Type::kString: return "a string";
    case Type::kArray: return "an array";
    case Type::kObject: return "an object";
  }
  return "unknown";
}

// ---- writer ---------------------------------------------------------------------------------

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one (overlong forms,
// surrogates and code points above U+10FFFF are invalid too).
size_t utf8_sequence(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
  else return 0;
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

void write_string(std::string& out, const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < s.size();) {
    uint8_t c = static_cast<uint8_t>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      default: break;
    }
    if (c < 0x20) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
      continue;
    }
    size_t n = utf8_sequence(s, i);
    if (n == 0) {
      out += "\\ufffd";  // a stray byte: the document must stay valid UTF-8
      ++i;
      continue;
    }
    out.append(s, i, n);
    i += n;
  }
  out += '"';
}

bool scalar(const Value& v) { return !v.is_array() && !v.is_object(); }

void newline(std::string& out, int indent, int level) {
  if (indent <= 0) return;
  out += '\n';
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

void write_value(std::string& out, const Value& v, int indent, int level);

void write_array(std::string& out, const Value& v, int indent, int level) {
  if (v.items().empty()) {
    out += "[]";
    return;
  }
  bool flat = true;
  for (const Value& e : v.items()) flat = flat && scalar(e);
  out += '[';
  for (size_t i = 0; i < v.items().size(); ++i) {
    if (i) out += indent > 0 && flat ? ", " : ",";
    if (!flat) newline(out, indent, level + 1);
    write_value(out, v.items()[i], indent, level + 1);
  }
  if (!flat) newline(out, indent, level);
  out += ']';
}

void write_object(std::string& out, const Value& v, int indent, int level) {
  if (v.members().empty()) {
    out += "{}";
    return;
  }
  out += '{';
  for (size_t i = 0; i < v.members().size(); ++i) {
    if (i) out += ',';
    newline(out, indent, level + 1);
    write_string(out, v.members()[i].key);
    out += indent > 0 ? ": " : ":";
    write_value(out, v.members()[i].value, indent, level + 1);
  }
  newline(out, indent, level);
  out += '}';
}

void write_value(std::string& out, const Value& v, int indent, int level) {
  switch (v.type()) {
    case Value::Type::kNull: out += "null"; break;
    case Value::Type::kBool: {
      bool b = false;
      v.get_bool(&b);
      out += b ? "true" : "false";
      break;
    }
    case Value::Type::kNumber: out += dump_number(v); break;
    case Value::Type::kString: write_string(out, v.str()); break;
    case Value::Type::kArray: write_array(out, v, indent, level); break;
    case Value::Type::kObject: write_object(out, v, indent, level); break;
  }
}

}  // namespace

// Integers are written exactly; doubles in their shortest round-trip form (std::to_chars does not
// depend on the locale, unlike printf). JSON has no NaN or infinity: those become null.
std::string dump_number(const Value& v) {
  char buf[64];
  std::to_chars_result r{};
  switch (v.num_) {
    case Value::Num::kUint: r = std::to_chars(buf, buf + sizeof buf, v.u_); break;
    case Value::Num::kInt: r = std::to_chars(buf, buf + sizeof buf, v.i_); break;
    case Value::Num::kDouble:
      if (!std::isfinite(v.d_)) return "null";
      r = std::to_chars(buf, buf + sizeof buf, v.d_);
      break;
  }
  std::string s(buf, r.ptr);
  // "1e+20" and "3" are valid JSON, but a double written as "3" would read back as an integer.
  if (v.num_ == Value::Num::kDouble && s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string dump(const Value& v, int indent) {
  std::string out;
  write_value(out, v, indent, 0);
  return out;
}

// ---- parser ---------------------------------------------------------------------------------

namespace {

class Parser {
 public:
  Parser(const std::string& text, size_t max_depth) : s_(text), max_depth_(max_depth) {}

  Result<Value> document() {
    Value v;
    skip_ws();
    if (!value(&v, 0)) return error_;
    skip_ws();
    if (pos_ != s_.size()) return fail("unexpected data after the document");
    return v;
  }

 private:
  Status fail(const std::string& why) {
    if (error_.ok()) error_ = Error(FOUNDRY_ERR_FORMAT, "JSON: " + why + " at byte " + std::to_string(pos_));
    return error_;
  }
  bool failed(const std::string& why) {
    fail(why);
    return false;
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  bool literal(const char* word, Value v, Value* out) {
    size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return failed("invalid literal");
    pos_ += n;
    *out = std::move(v);
    return true;
  }

  bool value(Value* out, size_t depth) {
    if (at_end()) return failed("unexpected end of input");
    switch (peek()) {
      case '{': return object(out, depth + 1);
      case '[': return array(out, depth + 1);
      case '"': {
        std::string s;
        if (!string(&s)) return false;
        *out = Value::string(std::move(s));
        return true;
      }
      case 't': return literal("true", Value::boolean(true), out);
      case 'f': return literal("false", Value::boolean(false), out);
      case 'n': return literal("null", Value::null(), out);
      default: return number(out);
    }
  }

  bool enter(size_t depth) {
    if (depth > max_depth_) return failed("nesting deeper than " + std::to_string(max_depth_) + " levels");
    return true;
  }

  bool array(Value* out, size_t depth) {
    if (!enter(depth)) return false;
    ++pos_;  // '['
    Value arr = Value::array();
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      *out = std::move(arr);
      return true;
    }
    for (;;) {
      skip_ws();
      Value elem;
      if (!value(&elem, depth)) return false;
      arr.push(std::move(elem));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        *out = std::move(arr);
        return true;
      }
      return failed(at_end() ? "unexpected end of input in an array" : "expected ',' or ']' in an array");
    }
  }

  bool object(Value* out, size_t depth) {
    if (!enter(depth)) return false;
    ++pos_;  // '{'
    Value obj = Value::object();
    std::unordered_set<std::string> keys;  // duplicates found in constant time, not by a scan
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      *out = std::move(obj);
      return true;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') return failed(at_end() ? "unexpected end of input in an object" : "expected a member name");
      size_t key_at = pos_;
      std::string key;
      if (!string(&key)) return false;
      // A duplicate would make the document mean whatever the last (or first) reader picks.
      if (!keys.insert(key).second) {
        pos_ = key_at;
        return failed("duplicate member \"" + key + "\"");
      }
      skip_ws();
      if (peek() != ':') return failed("expected ':' after a member name");
      ++pos_;
      skip_ws();
      Value v;
      if (!value(&v, depth)) return false;
      obj.add(std::move(key), std::move(v));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        *out = std::move(obj);
        return true;
      }
      return failed(at_end() ? "unexpected end of input in an object" : "expected ',' or '}' in an object");
    }
  }

  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  bool hex4(uint32_t* out) {
    if (s_.size() - pos_ < 4) return failed("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      int d = hex_digit(s_[pos_ + i]);
      if (d < 0) return failed("invalid \\u escape");
      v = (v << 4) | static_cast<uint32_t>(d);
    }
    pos_ += 4;
    *out = v;
    return true;
  }

  static void append_utf8(std::string* s, uint32_t cp) {
    if (cp < 0x80) {
      *s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *s += static_cast<char>(0xC0 | (cp >> 6));
      *s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *s += static_cast<char>(0xE0 | (cp >> 12));
      *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *s += static_cast<char>(0xF0 | (cp >> 18));
      *s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // \uXXXX, combining a surrogate pair into one code point; a lone surrogate is refused (it has
  // no UTF-8 encoding).
  bool unicode_escape(std::string* out) {
    uint32_t cp = 0;
    if (!hex4(&cp)) return false;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return failed("unpaired low surrogate in a \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (s_.compare(pos_, 2, "\\u") != 0) return failed("unpaired high surrogate in a \\u escape");
      pos_ += 2;
      uint32_t low = 0;
      if (!hex4(&low)) return false;
      if (low < 0xDC00 || low > 0xDFFF) return failed("invalid low surrogate in a \\u escape");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(out, cp);
    return true;
  }

  bool escape(std::string* out) {
    if (at_end()) return failed("unterminated string");
    char c = s_[pos_++];
    switch (c) {
      case '"': *out += '"'; return true;
      case '\\': *out += '\\'; return true;
      case '/': *out += '/'; return true;
      case 'b': *out += '\b'; return true;
      case 'f': *out += '\f'; return true;
      case 'n': *out += '\n'; return true;
      case 'r': *out += '\r'; return true;
      case 't': *out += '\t'; return true;
      case 'u': return unicode_escape(out);
      default: --pos_; return failed("invalid escape");
    }
  }

  bool string(std::string* out) {
    ++pos_;  // opening quote
    for (;;) {
      if (at_end()) return failed("unterminated string");
      uint8_t c = static_cast<uint8_t>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c == '\\') {
        ++pos_;
        if (!escape(out)) return false;
        continue;
      }
      if (c < 0x20) return failed("control character in a string");
      size_t n = utf8_sequence(s_, pos_);
      if (n == 0) return failed("invalid UTF-8 in a string");
      out->append(s_, pos_, n);
      pos_ += n;
    }
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  // Grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool number(Value* out) {
    size_t start = pos_;
    bool negative = peek() == '-';
    if (negative) ++pos_;
    if (!digit(peek())) return failed(negative ? "expected a digit after '-'" : "unexpected character");
    if (peek() == '0') {
      ++pos_;
      if (digit(peek())) return failed("leading zero in a number");
    } else {
      while (digit(peek())) ++pos_;
    }
    bool integral = true;
    if (peek() == '.') {
      integral = false;
      ++pos_;
      if (!digit(peek())) return failed("expected a digit after '.'");
      while (digit(peek())) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digit(peek())) return failed("expected a digit in the exponent");
      while (digit(peek())) ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (integral && integer(first, last, negative, out)) return true;
    double d = 0;
    auto r = std::from_chars(first, last, d);
    // Out of double range: from_chars reports it; the text was well-formed, so say what is wrong.
    if (r.ec != std::errc() || r.ptr != last) return failed("number out of range");
    *out = Value::number(d);
    return true;
  }

  // Exact integers; false (without error) when out of the 64-bit ranges, to fall back to double.
  static bool integer(const char* first, const char* last, bool negative, Value* out) {
    if (negative) {
      int64_t v = 0;
      auto r = std::from_chars(first, last, v);
      if (r.ec != std::errc() || r.ptr != last) return false;
      *out = Value::i64(v);
      return true;
    }
    uint64_t v = 0;
    auto r = std::from_chars(first, last, v);
    if (r.ec != std::errc() || r.ptr != last) return false;
    *out = Value::u64(v);
    return true;
  }

  const std::string& s_;
  size_t max_depth_;
  size_t pos_ = 0;
  Status error_;
};

}  // namespace

Result<Value> parse(const std::string& text, size_t max_depth) { return Parser(text, max_depth).document(); }

}  // namespace json
}  // namespace foundry
