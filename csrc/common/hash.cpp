// XXH64, written from the public specification (xxhash.com, "xxHash fast digest algorithm").
// Input is consumed as four independent lanes over 32-byte stripes; the tail (< 32 bytes) is
// mixed 8, 4 and 1 bytes at a time, then the result is avalanched.
#include "common/hash.h"

#include <cstring>

namespace foundry {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// The specification reads input little-endian; memcpy keeps unaligned loads legal and compiles to
// a single load on the (little-endian) targets this library supports.
inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline uint64_t mix_round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  acc = rotl(acc, 31);
  return acc * kPrime1;
}

inline uint64_t merge_round(uint64_t acc, uint64_t lane) {
  acc ^= mix_round(0, lane);
  return acc * kPrime1 + kPrime4;
}

inline void init_lanes(uint64_t lanes[4], uint64_t seed) {
  lanes[0] = seed + kPrime1 + kPrime2;
  lanes[1] = seed + kPrime2;
  lanes[2] = seed;
  lanes[3] = seed - kPrime1;
}

// Folds every whole stripe of [p, p+size) into the lanes; returns the bytes consumed.
// Lanes live in locals so the compiler keeps them in registers across the loop.
size_t consume_stripes(uint64_t lanes[4], const uint8_t* p, size_t size) {
  uint64_t v1 = lanes[0], v2 = lanes[1], v3 = lanes[2], v4 = lanes[3];
  const uint8_t* const start = p;
  const uint8_t* const limit = p + (size & ~size_t(31));
  while (p < limit) {
    v1 = mix_round(v1, load64(p));
    v2 = mix_round(v2, load64(p + 8));
    v3 = mix_round(v3, load64(p + 16));
    v4 = mix_round(v4, load64(p + 24));
    p += 32;
  }
  lanes[0] = v1;
  lanes[1] = v2;
  lanes[2] = v3;
  lanes[3] = v4;
  return size_t(p - start);
}

uint64_t converge_lanes(const uint64_t lanes[4]) {
  uint64_t h = rotl(lanes[0], 1) + rotl(lanes[1], 7) + rotl(lanes[2], 12) + rotl(lanes[3], 18);
  for (int i = 0; i < 4; ++i) h = merge_round(h, lanes[i]);
  return h;
}

// Mixes the final < 32 bytes into h and avalanches it.
uint64_t finish(uint64_t h, const uint8_t* p, size_t size) {
  while (size >= 8) {
    h ^= mix_round(0, load64(p));
    h = rotl(h, 27) * kPrime1 + kPrime4;
    p += 8;
    size -= 8;
  }
  if (size >= 4) {
    h ^= uint64_t(load32(p)) * kPrime1;
    h = rotl(h, 23) * kPrime2 + kPrime3;
    p += 4;
    size -= 4;
  }
  while (size > 0) {
    h ^= uint64_t(*p) * kPrime5;
    h = rotl(h, 11) * kPrime1;
    ++p;
    --size;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t hash64(const void* data, size_t size, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t h;
  size_t done = 0;
  if (size >= 32) {
    uint64_t lanes[4];
    init_lanes(lanes, seed);
    done = consume_stripes(lanes, p, size);
    h = converge_lanes(lanes);
  } else {
    h = seed + kPrime5;
  }
  h += uint64_t(size);
  return finish(h, p + done, size - done);
}

void Hasher64::reset(uint64_t seed) {
  seed_ = seed;
  init_lanes(lanes_, seed);
  total_ = 0;
  pending_size_ = 0;
}

void Hasher64::update(const void* data, size_t size) {
  if (size == 0) return;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += size;
  // Complete a pending partial stripe first so the lanes always see input in order.
  if (pending_size_ > 0) {
    size_t take = sizeof(pending_) - pending_size_;
    if (take > size) take = size;
    std::memcpy(pending_ + pending_size_, p, take);
    pending_size_ += take;
    p += take;
    size -= take;
    if (pending_size_ < sizeof(pending_)) return;
    consume_stripes(lanes_, pending_, sizeof(pending_));
    pending_size_ = 0;
  }
  size_t done = consume_stripes(lanes_, p, size);
  pending_size_ = size - done;
  if (pending_size_ > 0) std::memcpy(pending_, p + done, pending_size_);
}

uint64_t Hasher64::digest() const {
  // Inputs shorter than one stripe never touched the lanes: the one-shot path seeds h directly.
  uint64_t h = total_ >= 32 ? converge_lanes(lanes_) : seed_ + kPrime5;
  h += total_;
  return finish(h, pending_, pending_size_);
}

}  // namespace foundry
