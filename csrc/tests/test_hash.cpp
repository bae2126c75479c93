// XXH64 against vectors computed with the reference implementation (Python `xxhash` 3.x:
// xxhash.xxh64_intdigest(pattern(n), seed), pattern(n)[i] = (i * 131 + 7) & 0xff), and streaming
// against one-shot at every split point.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/hash.h"
#include "tests/check.h"

namespace {

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t((i * 131 + 7) & 0xff);
  return v;
}

struct Vector {
  size_t size;
  uint64_t seed;
  uint64_t expected;
};

// Lengths straddle every tail path (1/4/8-byte steps) and the 32-byte stripe boundary.
const Vector kVectors[] = {
    {0, 0x0ULL, 0xEF46DB3751D8E999ULL},
    {1, 0x0ULL, 0xA96C7F0CE858BBB7ULL},
    {2, 0x0ULL, 0xC22C6A70AD56BBA6ULL},
    {3, 0x0ULL, 0xBED43740EE6332BBULL},
    {4, 0x0ULL, 0xFA212AE44B3BB23DULL},
    {5, 0x0ULL, 0xD339DCC9AC8E6776ULL},
    {7, 0x0ULL, 0x2744460DD675D2C0ULL},
    {8, 0x0ULL, 0x994B676B71CE94DDULL},
    {9, 0x0ULL, 0x572B84C18B983AF8ULL},
    {15, 0x0ULL, 0x09E6451ED2FF8B1DULL},
    {16, 0x0ULL, 0x94AD0095E72B24D5ULL},
    {17, 0x0ULL, 0x1464F2EFF23B5FE1ULL},
    {31, 0x0ULL, 0x6711D55E306B5D8FULL},
    {32, 0x0ULL, 0x07F7B8E3BC5D6E25ULL},
    {33, 0x0ULL, 0x09F85EEB4E1CBE9FULL},
    {47, 0x0ULL, 0x79BD9D6DD8C15570ULL},
    {63, 0x0ULL, 0xB7C9968C066CB6A5ULL},
    {64, 0x0ULL, 0x50D4159A0411632EULL},
    {65, 0x0ULL, 0xD277176BFF863EFCULL},
    {100, 0x0ULL, 0x9DDADA11D3DC2D8FULL},
    {255, 0x0ULL, 0x15A6DB05D4E83DF4ULL},
    {1000, 0x0ULL, 0x0BF0BDBCC82EB373ULL},
    {4096, 0x0ULL, 0xCF05ADF75ACA30CFULL},
    {0, 0x1ULL, 0xD5AFBA1336A3BE4BULL},
    {1, 0x1ULL, 0x0766883A0A47A96AULL},
    {2, 0x1ULL, 0x7C6CC620A3AF2705ULL},
    {3, 0x1ULL, 0x95BA63F005E6E6CAULL},
    {4, 0x1ULL, 0x319607B5CA9D59D4ULL},
    {5, 0x1ULL, 0xE07F25FB3A8E5DE9ULL},
    {7, 0x1ULL, 0x0047CDCE49D4BC99ULL},
    {8, 0x1ULL, 0xC14D78E582FE5026ULL},
    {9, 0x1ULL, 0xDB001655FE3A4B7AULL},
    {15, 0x1ULL, 0x40A4206CC723CCE4ULL},
    {16, 0x1ULL, 0x0C9B8F12F2AE6C76ULL},
    {17, 0x1ULL, 0x418DF2ECDE29D078ULL},
    {31, 0x1ULL, 0xE811D10B03941E82ULL},
    {32, 0x1ULL, 0xDF4F0F6EA84EBBCAULL},
    {33, 0x1ULL, 0x489F1772049E476CULL},
    {47, 0x1ULL, 0x50D46FC41711A14AULL},
    {63, 0x1ULL, 0xBE65BC64322F219BULL},
    {64, 0x1ULL, 0x8EA281CE694F574DULL},
    {65, 0x1ULL, 0x1B26DDAA63626478ULL},
    {100, 0x1ULL, 0xE6A0D25E6E0A7F2AULL},
    {255, 0x1ULL, 0xBEFF7578626DAE08ULL},
    {1000, 0x1ULL, 0x82F34486D530BE54ULL},
    {4096, 0x1ULL, 0x36ECDCFCEAB58F91ULL},
    {0, 0x9E3779B97F4A7C15ULL, 0xC4349FC93C010000ULL},
    {1, 0x9E3779B97F4A7C15ULL, 0x585882422A6165E7ULL},
    {2, 0x9E3779B97F4A7C15ULL, 0x44C43596A6307BB0ULL},
    {3, 0x9E3779B97F4A7C15ULL, 0x45FA1406538FA168ULL},
    {4, 0x9E3779B97F4A7C15ULL, 0xA65107F22943365AULL},
    {5, 0x9E3779B97F4A7C15ULL, 0xF51EDA3A20DE9B88ULL},
    {7, 0x9E3779B97F4A7C15ULL, 0xC9B637E2C4599DE2ULL},
    {8, 0x9E3779B97F4A7C15ULL, 0xCE592D5F53E192ECULL},
    {9, 0x9E3779B97F4A7C15ULL, 0x5495AA796DE8AB73ULL},
    {15, 0x9E3779B97F4A7C15ULL, 0x47A857D1F90C35E1ULL},
    {16, 0x9E3779B97F4A7C15ULL, 0x3F8FEA7C86A04013ULL},
    {17, 0x9E3779B97F4A7C15ULL, 0xE5044D205F3D2F74ULL},
    {31, 0x9E3779B97F4A7C15ULL, 0x24C4E99AB0404B5EULL},
    {32, 0x9E3779B97F4A7C15ULL, 0x046E99BBDA1A814BULL},
    {33, 0x9E3779B97F4A7C15ULL, 0xD7FE2BFEE6E4CDEDULL},
    {47, 0x9E3779B97F4A7C15ULL, 0xD501E97A9945F0BBULL},
    {63, 0x9E3779B97F4A7C15ULL, 0xBD457F9EA47180C8ULL},
    {64, 0x9E3779B97F4A7C15ULL, 0xA768F350A8E4FCF6ULL},
    {65, 0x9E3779B97F4A7C15ULL, 0xFE99AB21E40D4B0CULL},
    {100, 0x9E3779B97F4A7C15ULL, 0x35546BD9A4779AE4ULL},
    {255, 0x9E3779B97F4A7C15ULL, 0xF91CB247D93DFE82ULL},
    {1000, 0x9E3779B97F4A7C15ULL, 0x3ECB5D7B5E7C64CFULL},
    {4096, 0x9E3779B97F4A7C15ULL, 0x1ED4FA0C97932CBFULL},
};

}  // namespace

TEST_CASE("xxh64 matches reference vectors") {
  for (const Vector& v : kVectors) {
    std::vector<uint8_t> data = pattern(v.size);
    uint64_t got = foundry::hash64(data.data(), data.size(), v.seed);
    if (got != v.expected) std::fprintf(stderr, "size %zu seed %llx: got %016llx\n", v.size,
                                        (unsigned long long)v.seed, (unsigned long long)got);
    CHECK_EQ(got, v.expected);
  }
}

TEST_CASE("xxh64 of well-known strings") {
  CHECK_EQ(foundry::hash64("abc", 3), 0x44BC2CF5AD770999ULL);
  const char* fox = "The quick brown fox jumps over the lazy dog";
  CHECK_EQ(foundry::hash64(fox, std::strlen(fox)), 0x0B242D361FDA71BCULL);
  CHECK_EQ(foundry::hash64(nullptr, 0), 0xEF46DB3751D8E999ULL);
}

TEST_CASE("xxh64 of one MiB, seed 42") {
  std::vector<uint8_t> data = pattern(size_t(1) << 20);
  CHECK_EQ(foundry::hash64(data.data(), data.size(), 42), 0x2117F5BC67D28CC0ULL);
  foundry::Hasher64 h(42);
  // Odd chunk sizes so stripes keep straddling update() calls.
  for (size_t off = 0; off < data.size();) {
    size_t n = std::min<size_t>(4099, data.size() - off);
    h.update(data.data() + off, n);
    off += n;
  }
  CHECK_EQ(h.digest(), 0x2117F5BC67D28CC0ULL);
}

TEST_CASE("streaming equals one-shot at every split point") {
  std::vector<uint8_t> data = pattern(200);
  for (size_t n : {size_t(0), size_t(5), size_t(31), size_t(32), size_t(33), size_t(64), size_t(100), size_t(200)}) {
    uint64_t want = foundry::hash64(data.data(), n, 7);
    for (size_t a = 0; a <= n; ++a) {
      for (size_t b = a; b <= n; b += (n > 64 ? 7 : 1)) {
        foundry::Hasher64 h(7);
        h.update(data.data(), a);
        h.update(data.data() + a, b - a);
        h.update(data.data() + b, n - b);
        CHECK_EQ(h.digest(), want);
      }
    }
  }
}

TEST_CASE("streaming byte by byte, digest mid-stream, reset") {
  std::vector<uint8_t> data = pattern(300);
  foundry::Hasher64 h(3);
  for (size_t i = 0; i < data.size(); ++i) {
    h.update(&data[i], 1);
    // digest() must not disturb the state.
    CHECK_EQ(h.digest(), foundry::hash64(data.data(), i + 1, 3));
  }
  h.reset(9);
  CHECK_EQ(h.digest(), foundry::hash64(nullptr, 0, 9));
  h.update(data.data(), 0);
  CHECK_EQ(h.digest(), foundry::hash64(nullptr, 0, 9));
}

TEST_MAIN()
