// Little-endian byte encoding for archive payloads.
//
// ByteWriter appends; it cannot fail (short of running out of memory). ByteReader reads from a
// borrowed buffer that may be hostile: every read is bounds-checked and returns false instead of
// reading past the end. The first failure is remembered ("sticky") together with its offset, so a
// decoder can chain many reads and check once with status("what was being read").
//
// Encodings: integers are fixed-width little-endian; f64 is the IEEE-754 bit pattern as a u64;
// strings and blobs are a u64 byte length followed by the bytes (no terminator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"

namespace foundry {

// A borrowed, read-only view of bytes (C++17 has no std::span).
struct ByteSpan {
  const uint8_t* data = nullptr;
  size_t size = 0;

  const uint8_t* begin() const { return data; }
  const uint8_t* end() const { return data == nullptr ? nullptr : data + size; }
  bool empty() const { return size == 0; }
  std::vector<uint8_t> to_vector() const { return std::vector<uint8_t>(begin(), end()); }
};

class ByteWriter {
 public:
  void u8(uint8_t v) { buf_.push_back(v); }
  void u16(uint16_t v) { put_le(v, 2); }
  void u32(uint32_t v) { put_le(v, 4); }
  void u64(uint64_t v) { put_le(v, 8); }
  // Two's complement, so the conversion to unsigned is well defined.
  void i64(int64_t v) { put_le(static_cast<uint64_t>(v), 8); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    put_le(bits, 8);
  }
  void raw(const void* data, size_t size) {
    if (size == 0) return;  // data may be null for an empty payload
    const uint8_t* p = static_cast<const uint8_t*>(data);
    buf_.insert(buf_.end(), p, p + size);
  }
  void string(const std::string& s) { blob(s.data(), s.size()); }
  void blob(const void* data, size_t size) {
    u64(size);
    raw(data, size);
  }
  // Appends zero bytes until size() is a multiple of `alignment` (a power of two or any n > 0).
  void pad_to(size_t alignment) {
    if (alignment == 0) return;
    while (buf_.size() % alignment != 0) buf_.push_back(0);
  }
  size_t size() const { return buf_.size(); }
  // Overwrites 8 bytes at `offset` (e.g. a length or offset known only later). False when the
  // range is not inside what was written.
  bool patch_u64(size_t offset, uint64_t v) {
    if (offset > buf_.size() || buf_.size() - offset < 8) return false;
    for (int i = 0; i < 8; ++i) buf_[offset + i] = static_cast<uint8_t>(v >> (8 * i));
    return true;
  }
  const std::vector<uint8_t>& bytes() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  void put_le(uint64_t v, int width) {
    for (int i = 0; i < width; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }

  std::vector<uint8_t> buf_;
};

class ByteReader {
 public:
  ByteReader() = default;
  ByteReader(const uint8_t* data, size_t size) : data_(size == 0 ? nullptr : data), size_(data ? size : 0) {}
  explicit ByteReader(ByteSpan span) : ByteReader(span.data, span.size) {}

  bool u8(uint8_t* out) { return get_le(out, 1); }
  bool u16(uint16_t* out) { return get_le(out, 2); }
  bool u32(uint32_t* out) { return get_le(out, 4); }
  bool u64(uint64_t* out) { return get_le(out, 8); }
  bool i64(int64_t* out) {
    uint64_t bits;
    if (!get_le(&bits, 8)) return false;
    // Implementation-defined before C++20 (never UB); two's complement on every compiler we use.
    *out = static_cast<int64_t>(bits);
    return true;
  }
  bool f64(double* out) {
    uint64_t bits;
    if (!get_le(&bits, 8)) return false;
    std::memcpy(out, &bits, sizeof bits);
    return true;
  }
  bool raw(void* out, size_t n) {
    ByteSpan s;
    if (!bytes(n, &s)) return false;
    if (n != 0) std::memcpy(out, s.data, n);
    return true;
  }
  bool skip(size_t n) {
    ByteSpan ignored;
    return bytes(n, &ignored);
  }
  // A view of the next n bytes (valid as long as the underlying buffer is).
  bool bytes(size_t n, ByteSpan* out) {
    if (!need(n)) return false;
    out->data = n == 0 ? nullptr : data_ + pos_;
    out->size = n;
    pos_ += n;
    return true;
  }
  // A u64-length-prefixed string of at most max_len bytes. The limit is checked before anything
  // is allocated, so a hostile length cannot make us allocate gigabytes.
  bool string(std::string* out, size_t max_len) {
    ByteSpan s;
    if (!blob(&s, max_len)) return false;
    out->assign(reinterpret_cast<const char*>(s.begin()), s.size);
    return true;
  }
  // A u64-length-prefixed blob of at most max_len bytes, as a view.
  bool blob(ByteSpan* out, size_t max_len) {
    size_t at = pos_;
    uint64_t len;
    if (!u64(&len)) return false;
    if (len > max_len) return fail(at, Failure::kTooLong, len, max_len);
    if (len > remaining()) return fail(at, Failure::kTruncated, len, remaining());
    return bytes(static_cast<size_t>(len), out);
  }
  // An element count (u32) for a following array whose elements take at least min_bytes_each
  // bytes: refused when the rest of the buffer cannot possibly hold that many, so callers may
  // reserve() count elements without trusting the length field.
  bool count32(uint32_t* out, size_t min_bytes_each) {
    size_t at = pos_;
    uint32_t n;
    if (!u32(&n)) return false;
    if (min_bytes_each != 0 && n > remaining() / min_bytes_each)
      return fail(at, Failure::kCountTooLarge, n, remaining());
    *out = n;
    return true;
  }

  size_t offset() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }
  bool at_end() const { return pos_ == size_; }
  bool ok() const { return failure_ == Failure::kNone; }

  // OK when no read failed; otherwise a FOUNDRY_ERR_FORMAT naming `what` and the first failure,
  // e.g. "truncated section table at offset 96 (needed 8 bytes, 3 remain)".
  Status status(const char* what) const {
    switch (failure_) {
      case Failure::kNone:
        return Status::Ok();
      case Failure::kTruncated:
        return Error(FOUNDRY_ERR_FORMAT, "truncated " + std::string(what) + " at offset " +
                                             std::to_string(fail_at_) + " (needed " + std::to_string(fail_a_) +
                                             " bytes, " + std::to_string(fail_b_) + " remain)");
      case Failure::kTooLong:
        return Error(FOUNDRY_ERR_FORMAT, std::string(what) + ": length " + std::to_string(fail_a_) +
                                             " at offset " + std::to_string(fail_at_) + " exceeds the limit of " +
                                             std::to_string(fail_b_) + " bytes");
      case Failure::kCountTooLarge:
        return Error(FOUNDRY_ERR_FORMAT, std::string(what) + ": element count " + std::to_string(fail_a_) +
                                             " at offset " + std::to_string(fail_at_) + " cannot fit in the " +
                                             std::to_string(fail_b_) + " bytes that follow");
    }
    return Error(FOUNDRY_ERR_FORMAT, std::string(what) + ": unreadable");
  }

 private:
  enum class Failure { kNone, kTruncated, kTooLong, kCountTooLarge };

  // True when n more bytes can be read; otherwise records a truncation. Once a read has failed
  // every later read fails too, so a decoder never continues from a misaligned position.
  bool need(size_t n) {
    if (failure_ != Failure::kNone) return false;
    if (n > remaining()) return fail(pos_, Failure::kTruncated, n, remaining());
    return true;
  }
  bool fail(size_t at, Failure why, uint64_t a, uint64_t b) {
    if (failure_ == Failure::kNone) {
      failure_ = why;
      fail_at_ = at;
      fail_a_ = a;
      fail_b_ = b;
    }
    return false;
  }
  template <typename T>
  bool get_le(T* out, int width) {
    if (!need(static_cast<size_t>(width))) return false;
    uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
    pos_ += static_cast<size_t>(width);
    *out = static_cast<T>(v);
    return true;
  }

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t pos_ = 0;
  Failure failure_ = Failure::kNone;
  size_t fail_at_ = 0;
  uint64_t fail_a_ = 0;
  uint64_t fail_b_ = 0;
};

}  // namespace foundry
