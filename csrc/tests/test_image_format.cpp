// Image parsing against real nvcc 13 output (tests/data/image_samples.h) and hand-built
// wrappers and ELFs; truncated and corrupted inputs must be refused without reading out of bounds
// (build with -DFOUNDRY_SANITIZE=ON to have ASan check that).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/hash.h"
#include "modules/image_format.h"
#include "tests/check.h"
#include "tests/data/image_samples.h"

using foundry::ImageKind;
using namespace foundry_test_data;

namespace {

using Bytes = std::vector<uint8_t>;

template <size_t N>
Bytes bytes_of(const unsigned char (&a)[N]) {
  return Bytes(a, a + N);
}

// An exact-size heap copy, so that any read past `size` is a heap overflow ASan reports.
std::unique_ptr<uint8_t[]> exact_copy(const uint8_t* data, size_t size) {
  std::unique_ptr<uint8_t[]> p(new uint8_t[size == 0 ? 1 : size]);
  if (size) std::memcpy(p.get(), data, size);
  return p;
}

// Same layout as __fatBinC_Wrapper_t (fatbinary_section.h).
struct Wrapper {
  int magic;
  int version;
  const unsigned long long* data;
  void* filename_or_fatbins;
};

Wrapper make_wrapper(int version, const void* data, void* fatbins) {
  return Wrapper{int(foundry::kFatbinWrapperMagic), version, static_cast<const unsigned long long*>(data), fatbins};
}

// Runs every parser over [data, data+size); they may fail but must not crash or over-read.
void exercise_all_parsers(const uint8_t* data, size_t size) {
  auto view = foundry::inspect_image(data, size);
  if (view.ok()) {
    CHECK(view.value().total_size <= size);
    (void)foundry::image_content_hash(view.value());
  }
  (void)foundry::fatbin_size(data, size);
  (void)foundry::elf_image_size(data, size);
  (void)foundry::ptx_size(data, size);
  auto entries = foundry::list_fatbin_entries(data, size);
  if (entries.ok()) {
    for (const auto& e : entries.value()) {
      CHECK(e.payload >= data && e.payload + e.payload_size <= data + size);
    }
  }
  for (int arch : {80, 90}) {
    auto cubin = foundry::extract_cubin(data, size, arch);
    if (cubin.ok() && !cubin.value().empty()) {
      CHECK(foundry::elf_image_size(cubin.value().data(), cubin.value().size()).ok());
    }
  }
  (void)foundry::cubin_kernel_names(data, size);
}

// ---- a minimal ELF builder for hand-made cubins ---------------------------------------------

struct Sym {
  std::string name;
  uint8_t info;   // (bind << 4) | type
  uint8_t other;
  uint16_t shndx;
};

template <typename T>
void put(Bytes& b, size_t at, T v) {
  if (b.size() < at + sizeof(T)) b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// Layout: ELF header | .strtab | .symtab | section headers [null, strtab, symtab, text].
// With xnum, e_shnum is 0 and the count lives in section header 0's sh_size.
Bytes build_elf(const std::vector<Sym>& syms, bool xnum = false) {
  Bytes strtab(1, 0);
  std::vector<uint32_t> name_off;
  for (const Sym& s : syms) {
    name_off.push_back(uint32_t(strtab.size()));
    strtab.insert(strtab.end(), s.name.begin(), s.name.end());
    strtab.push_back(0);
  }
  Bytes elf(64, 0);
  const uint8_t ident[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x41};
  std::memcpy(elf.data(), ident, sizeof(ident));
  const size_t strtab_off = 64;
  elf.insert(elf.end(), strtab.begin(), strtab.end());
  while (elf.size() % 8) elf.push_back(0);
  const size_t symtab_off = elf.size();
  const size_t symtab_size = 24 * (syms.size() + 1);
  elf.resize(symtab_off + symtab_size, 0);
  for (size_t i = 0; i < syms.size(); ++i) {
    const size_t at = symtab_off + 24 * (i + 1);
    put<uint32_t>(elf, at, name_off[i]);
    elf[at + 4] = syms[i].info;
    elf[at + 5] = syms[i].other;
    put<uint16_t>(elf, at + 6, syms[i].shndx);
  }
  const size_t text_off = elf.size();
  elf.resize(text_off + 16, 0);
  const size_t shoff = elf.size();
  const uint16_t shnum = 4;
  elf.resize(shoff + 64 * shnum, 0);
  auto section = [&](int i, uint32_t type, uint64_t off, uint64_t size, uint32_t link, uint64_t entsize) {
    const size_t at = shoff + 64 * size_t(i);
    put<uint32_t>(elf, at + 4, type);
    put<uint64_t>(elf, at + 24, off);
    put<uint64_t>(elf, at + 32, size);
    put<uint32_t>(elf, at + 40, link);
    put<uint64_t>(elf, at + 56, entsize);
  };
  section(1, 3, strtab_off, strtab.size(), 0, 0);
  section(2, 2, symtab_off, symtab_size, 1, 24);
  section(3, 1, text_off, 16, 0, 0);
  if (xnum) put<uint64_t>(elf, shoff + 32, shnum);  // section 0's sh_size
  put<uint16_t>(elf, 16, 2);    // ET_EXEC
  put<uint16_t>(elf, 18, 190);  // EM_CUDA
  put<uint64_t>(elf, 40, shoff);
  put<uint16_t>(elf, 52, 64);
  put<uint16_t>(elf, 58, 64);
  put<uint16_t>(elf, 60, xnum ? 0 : shnum);
  return elf;
}

uint64_t get_u64(const Bytes& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, sizeof(v));
  return v;
}

constexpr uint8_t kGlobalFunc = (1 << 4) | 2;
constexpr uint8_t kGlobalObject = (1 << 4) | 1;

std::set<std::string> as_set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

// A page of readable memory followed by an inaccessible one, for wild-pointer tests.
struct GuardedPage {
  uint8_t* base = nullptr;
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  GuardedPage() {
    void* p = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base = static_cast<uint8_t*>(p);
    mprotect(base + page, page, PROT_NONE);
  }
  ~GuardedPage() {
    if (base) munmap(base, 2 * page);
  }
  uint8_t* inaccessible() const { return base + page; }
};

}  // namespace

// ---- classification --------------------------------------------------------------------------

TEST_CASE("classify by first bytes") {
  CHECK(foundry::classify_image(kTinyFatbin, sizeof(kTinyFatbin)) == ImageKind::kFatbin);
  CHECK(foundry::classify_image(kTinySm90Cubin, sizeof(kTinySm90Cubin)) == ImageKind::kCubin);
  const char ptx[] = "//\n.version 9.0\n.target sm_90\n.address_size 64\n";
  CHECK(foundry::classify_image(ptx, sizeof(ptx)) == ImageKind::kPtx);
  Wrapper w = make_wrapper(1, kTinyFatbin, nullptr);
  CHECK(foundry::classify_image(&w, sizeof(w)) == ImageKind::kFatbinWrapper);
  const uint8_t junk[] = {0x00, 0x01, 0x02, 0x03, 0x04};
  CHECK(foundry::classify_image(junk, sizeof(junk)) == ImageKind::kUnknown);
  const uint8_t elf32[] = {0x7f, 'E', 'L', 'F', 1, 1, 1, 0};
  CHECK(foundry::classify_image(elf32, sizeof(elf32)) == ImageKind::kUnknown);
  CHECK(foundry::classify_image(kTinyFatbin, 0) == ImageKind::kUnknown);
  CHECK(foundry::classify_image(nullptr, 100) == ImageKind::kUnknown);
}

TEST_CASE("inspect a fatbin: exact size even with slack after it") {
  Bytes fb = bytes_of(kTinyFatbin);
  fb.resize(fb.size() + 100, 0xee);
  auto view = foundry::inspect_image(fb.data(), fb.size());
  CHECK(view.ok());
  CHECK(view.value().kind == ImageKind::kFatbin);
  CHECK_EQ(view.value().total_size, sizeof(kTinyFatbin));
  CHECK_EQ(view.value().segments.size(), size_t(1));
  CHECK_EQ(view.value().wrapper_version, 0);
  CHECK_EQ(foundry::image_content_hash(view.value()), foundry::hash64(kTinyFatbin, sizeof(kTinyFatbin)));
}

TEST_CASE("back-to-back fatbin containers concatenate") {
  Bytes two = bytes_of(kTinyFatbin);
  Bytes second = bytes_of(kTinyFatbinCompressed);
  two.insert(two.end(), second.begin(), second.end());
  auto view = foundry::inspect_image(two.data(), two.size());
  CHECK(view.ok());
  CHECK_EQ(view.value().total_size, two.size());
  CHECK_EQ(foundry::fatbin_container_size(two.data(), two.size()).value(), sizeof(kTinyFatbin));
  auto entries = foundry::list_fatbin_entries(two.data(), two.size());
  CHECK(entries.ok());
  CHECK_EQ(entries.value().size(), size_t(4));
}

TEST_CASE("inspect a cubin: size from the ELF tables") {
  Bytes elf = bytes_of(kTinySm90Cubin);
  elf.resize(elf.size() + 64, 0);
  auto view = foundry::inspect_image(elf.data(), elf.size());
  CHECK(view.ok());
  CHECK(view.value().kind == ImageKind::kCubin);
  CHECK_EQ(view.value().total_size, sizeof(kTinySm90Cubin));
}

TEST_CASE("inspect PTX: size includes the NUL") {
  const char ptx[] = "//\n.version 9.0\n.target sm_90\n.address_size 64\n";
  auto view = foundry::inspect_image(ptx, 1 << 20);  // the NUL stops the scan long before
  CHECK(view.ok());
  CHECK(view.value().kind == ImageKind::kPtx);
  CHECK_EQ(view.value().total_size, sizeof(ptx));
  // No terminator within max_size.
  auto cut = foundry::inspect_image(ptx, sizeof(ptx) - 1);
  CHECK(!cut.ok());
  CHECK_EQ(cut.status().code(), FOUNDRY_ERR_FORMAT);
  const char binary[] = "abc\x01" "def";
  CHECK(!foundry::inspect_image(binary, sizeof(binary)).ok());
}

TEST_CASE("unknown images are a format error naming the bytes") {
  const uint8_t junk[] = {0x00, 0x01, 0x02, 0x03};
  auto view = foundry::inspect_image(junk, sizeof(junk));
  CHECK(!view.ok());
  CHECK_EQ(view.status().code(), FOUNDRY_ERR_FORMAT);
  CHECK(view.status().message().find("0x0 0x1 0x2 0x3") != std::string::npos);
  CHECK_EQ(foundry::inspect_image(nullptr, 10).status().code(), FOUNDRY_ERR_INVALID_ARGUMENT);
}

// ---- fatbin entries --------------------------------------------------------------------------

TEST_CASE("fatbin entries of an nvcc 13 fatbin") {
  auto entries = foundry::list_fatbin_entries(kTinyFatbin, sizeof(kTinyFatbin));
  CHECK(entries.ok());
  const auto& e = entries.value();
  CHECK_EQ(e.size(), size_t(3));
  if (e.size() != 3) return;
  // nvcc orders entries as: sm_80 cubin, compute_90 PTX, sm_90 cubin.
  CHECK_EQ(e[0].kind, foundry::kFatbinEntryCubin);
  CHECK_EQ(e[0].arch, 80u);
  CHECK(!e[0].compressed);
  CHECK_EQ(e[1].kind, foundry::kFatbinEntryPtx);
  CHECK_EQ(e[1].arch, 90u);
  CHECK(e[1].compressed);  // nvcc 13 compresses PTX by default (zstd)
  CHECK((e[1].flags & foundry::kFatbinFlagCompressedZstd) != 0);
  CHECK(e[1].compressed_size <= e[1].payload_size);
  CHECK(e[1].uncompressed_size > 0);
  CHECK_EQ(e[2].kind, foundry::kFatbinEntryCubin);
  CHECK_EQ(e[2].arch, 90u);
  CHECK(!e[2].compressed);
  for (int i : {0, 2}) {
    CHECK(std::memcmp(e[i].payload, "\x7f" "ELF", 4) == 0);
    CHECK_EQ(e[i].major, 1);
    CHECK_EQ(e[i].minor, 8);
  }
  const uint8_t zstd_magic[] = {0x28, 0xb5, 0x2f, 0xfd};
  CHECK(std::memcmp(e[1].payload, zstd_magic, 4) == 0);
}

TEST_CASE("extract_cubin returns the exact -cubin bytes") {
  auto cubin = foundry::extract_cubin(kTinyFatbin, sizeof(kTinyFatbin), 90);
  CHECK(cubin.ok());
  CHECK(cubin.value() == bytes_of(kTinySm90Cubin));
  auto sm80 = foundry::extract_cubin(kTinyFatbin, sizeof(kTinyFatbin), 80);
  CHECK(sm80.ok());
  CHECK(!sm80.value().empty());
  auto names = foundry::cubin_kernel_names(sm80.value().data(), sm80.value().size());
  CHECK(names.ok());
  CHECK((as_set(names.value()) == std::set<std::string>{"tiny_apply", "_Z10tiny_scalePff"}));
}

TEST_CASE("extract_cubin: absent arch, compressed entry, bad arch") {
  auto none = foundry::extract_cubin(kTinyFatbin, sizeof(kTinyFatbin), 75);
  CHECK(none.ok());
  CHECK(none.value().empty());
  auto compressed = foundry::extract_cubin(kTinyFatbinCompressed, sizeof(kTinyFatbinCompressed), 90);
  CHECK(compressed.ok());
  CHECK(compressed.value().empty());
  auto entries = foundry::list_fatbin_entries(kTinyFatbinCompressed, sizeof(kTinyFatbinCompressed));
  CHECK(entries.ok() && entries.value().size() == 1 && entries.value()[0].compressed);
  CHECK_EQ(foundry::extract_cubin(kTinyFatbin, sizeof(kTinyFatbin), 0).status().code(),
           FOUNDRY_ERR_INVALID_ARGUMENT);
}

TEST_CASE("extract_cubin refuses a cubin entry that is not a valid ELF") {
  Bytes fb = bytes_of(kTinyFatbin);
  auto entries = foundry::list_fatbin_entries(fb.data(), fb.size());
  const auto& sm90 = entries.value()[2];
  // Point the ELF's section header table (e_shoff) far past the payload.
  const size_t elf_at = size_t(sm90.payload - fb.data());
  put<uint64_t>(fb, elf_at + 40, uint64_t(1) << 40);
  auto cubin = foundry::extract_cubin(fb.data(), fb.size(), 90);
  CHECK(!cubin.ok());
  CHECK_EQ(cubin.status().code(), FOUNDRY_ERR_FORMAT);
  CHECK(cubin.status().message().find("section header table") != std::string::npos);
}

TEST_CASE("arch-specific entries are preferred for the same arch number") {
  // Two sm_90 cubin entries; mark the first (a copy of sm_80's bytes) as sm_90a.
  Bytes fb = bytes_of(kTinyFatbin);
  auto entries = foundry::list_fatbin_entries(fb.data(), fb.size());
  const size_t first_entry = 16;
  put<uint32_t>(fb, first_entry + 0x1c, 90);
  put<uint64_t>(fb, first_entry + 0x28, entries.value()[0].flags | foundry::kFatbinFlagArchSpecific);
  auto cubin = foundry::extract_cubin(fb.data(), fb.size(), 90);
  CHECK(cubin.ok());
  const auto& sm80 = entries.value()[0];
  CHECK_EQ(cubin.value().size(), sm80.payload_size);
}

// ---- ELF -------------------------------------------------------------------------------------

TEST_CASE("cubin kernel names: STO_CUDA_ENTRY functions only") {
  auto names = foundry::cubin_kernel_names(kTinySm90Cubin, sizeof(kTinySm90Cubin));
  CHECK(names.ok());
  // tiny_twice is an STT_FUNC too, but without the entry bit.
  CHECK((as_set(names.value()) == std::set<std::string>{"tiny_apply", "_Z10tiny_scalePff"}));
}

TEST_CASE("hand-built ELF: entry, device function, undefined, object") {
  std::vector<Sym> syms = {
      {"kernel_one", kGlobalFunc, 0x10, 3},
      {"device_fn", kGlobalFunc, 0x00, 3},
      {"extern_kernel", kGlobalFunc, 0x10, 0},  // undefined
      {"some_data", kGlobalObject, 0x10, 3},
      {"kernel_two", kGlobalFunc, 0x10, 3},
  };
  for (bool xnum : {false, true}) {
    Bytes elf = build_elf(syms, xnum);
    auto size = foundry::elf_image_size(elf.data(), elf.size());
    CHECK(size.ok());
    CHECK_EQ(size.value(), elf.size());
    auto names = foundry::cubin_kernel_names(elf.data(), elf.size());
    CHECK(names.ok());
    CHECK((names.value() == std::vector<std::string>{"kernel_one", "kernel_two"}));
  }
}

TEST_CASE("ELF with a symbol name outside its string table is refused") {
  Bytes elf = build_elf({{"kernel_one", kGlobalFunc, 0x10, 3}});
  const uint64_t symtab_off = 64 + 16;  // strtab "\0kernel_one\0" (12 bytes) padded to 16
  put<uint32_t>(elf, symtab_off + 24, 5000);
  auto names = foundry::cubin_kernel_names(elf.data(), elf.size());
  CHECK(!names.ok());
  CHECK(names.status().message().find("string table") != std::string::npos);
}

TEST_CASE("ELF size validation names the cause") {
  Bytes elf = bytes_of(kTinySm90Cubin);
  Bytes bad = elf;
  put<uint16_t>(bad, 58, 40);  // e_shentsize
  auto r = foundry::elf_image_size(bad.data(), bad.size());
  CHECK(!r.ok() && r.status().message().find("entry size") != std::string::npos);
  bad = elf;
  put<uint64_t>(bad, 32, uint64_t(-1));  // e_phoff
  r = foundry::elf_image_size(bad.data(), bad.size());
  CHECK(!r.ok() && r.status().message().find("program header") != std::string::npos);
  // A section whose data runs past the end: section 1's sh_size.
  bad = elf;
  const uint64_t shoff = get_u64(elf, 40);
  put<uint64_t>(bad, size_t(shoff + 64 + 32), uint64_t(1) << 62);
  r = foundry::elf_image_size(bad.data(), bad.size());
  CHECK(!r.ok() && r.status().message().find("section 1") != std::string::npos);
}

// ---- truncation and corruption ---------------------------------------------------------------

TEST_CASE("every truncation of a fatbin is refused") {
  for (size_t len = 0; len < sizeof(kTinyFatbin); ++len) {
    auto buf = exact_copy(kTinyFatbin, len);
    auto view = foundry::inspect_image(buf.get(), len);
    CHECK(!view.ok());
    CHECK(!foundry::list_fatbin_entries(buf.get(), len).ok());
    CHECK(!foundry::extract_cubin(buf.get(), len, 90).ok());
  }
}

TEST_CASE("every truncation of a cubin is refused") {
  for (size_t len = 0; len < sizeof(kTinySm90Cubin); ++len) {
    auto buf = exact_copy(kTinySm90Cubin, len);
    CHECK(!foundry::inspect_image(buf.get(), len).ok());
    CHECK(!foundry::elf_image_size(buf.get(), len).ok());
    CHECK(!foundry::cubin_kernel_names(buf.get(), len).ok());
  }
}

TEST_CASE("corrupted fatbins and cubins never crash") {
  std::mt19937_64 rng(12345);
  const Bytes samples[] = {bytes_of(kTinyFatbin), bytes_of(kTinyFatbinCompressed), bytes_of(kTinySm90Cubin)};
  // Values that stress size arithmetic when they land in a length or offset field.
  const uint64_t nasty[] = {0, 1, 0x40, 0xffff, 0xffffffffull, 0x7fffffffffffffffull, ~0ull};
  for (const Bytes& sample : samples) {
    // Every 8-aligned word of every header region set to each nasty value.
    const size_t header_span = std::min<size_t>(sample.size(), 256);
    for (size_t at = 0; at + 8 <= header_span; at += 4) {
      for (uint64_t v : nasty) {
        Bytes b = sample;
        put<uint64_t>(b, at, v);
        auto buf = exact_copy(b.data(), b.size());
        exercise_all_parsers(buf.get(), b.size());
      }
    }
    // Random byte flips anywhere.
    for (int round = 0; round < 3000; ++round) {
      Bytes b = sample;
      const int flips = 1 + int(rng() % 4);
      for (int i = 0; i < flips; ++i) b[rng() % b.size()] = uint8_t(rng());
      auto buf = exact_copy(b.data(), b.size());
      exercise_all_parsers(buf.get(), b.size());
    }
  }
  // The ELF's section header table (at its e_shoff) gets the same word treatment.
  Bytes elf = bytes_of(kTinySm90Cubin);
  const uint64_t shoff = get_u64(elf, 40);
  for (size_t at = size_t(shoff); at + 8 <= elf.size(); at += 8) {
    for (uint64_t v : nasty) {
      Bytes b = elf;
      put<uint64_t>(b, at, v);
      auto buf = exact_copy(b.data(), b.size());
      exercise_all_parsers(buf.get(), b.size());
    }
  }
}

// ---- wrappers --------------------------------------------------------------------------------

TEST_CASE("wrapper v1 hashes like the fatbin it wraps") {
  Wrapper w = make_wrapper(1, kTinyFatbin, nullptr);
  auto view = foundry::inspect_image(&w, sizeof(w));
  CHECK(view.ok());
  CHECK(view.value().kind == ImageKind::kFatbinWrapper);
  CHECK_EQ(view.value().wrapper_version, 1);
  CHECK_EQ(view.value().segments.size(), size_t(1));
  CHECK_EQ(view.value().total_size, sizeof(kTinyFatbin));
  CHECK(view.value().segments[0].data == kTinyFatbin);
  auto raw = foundry::inspect_image(kTinyFatbin, sizeof(kTinyFatbin));
  CHECK_EQ(foundry::image_content_hash(view.value()), foundry::image_content_hash(raw.value()));
}

TEST_CASE("wrapper segments are one container even when another follows in memory") {
  // As in a linked .nv_fatbin section: translation units' fatbins sit back to back.
  Bytes two = bytes_of(kTinyFatbin);
  Bytes second = bytes_of(kTinyFatbinCompressed);
  two.insert(two.end(), second.begin(), second.end());
  Wrapper w = make_wrapper(1, two.data(), nullptr);
  auto view = foundry::inspect_image(&w, sizeof(w));
  CHECK(view.ok());
  CHECK_EQ(view.value().total_size, sizeof(kTinyFatbin));
}

TEST_CASE("wrapper v2: data then the prelinked fatbins") {
  Bytes a = bytes_of(kTinyFatbin), b = bytes_of(kTinyFatbinCompressed);
  const void* prelinked[] = {a.data(), b.data(), nullptr};
  Wrapper w = make_wrapper(2, kTinyFatbin, const_cast<void**>(prelinked));
  auto view = foundry::inspect_image(&w, sizeof(w));
  CHECK(view.ok());
  CHECK_EQ(view.value().wrapper_version, 2);
  CHECK_EQ(view.value().segments.size(), size_t(3));
  CHECK_EQ(view.value().total_size, 2 * sizeof(kTinyFatbin) + sizeof(kTinyFatbinCompressed));
  CHECK(view.value().segments[0].data == kTinyFatbin);
  CHECK(view.value().segments[1].data == a.data());
  CHECK(view.value().segments[2].data == b.data());
  Bytes all = bytes_of(kTinyFatbin);
  all.insert(all.end(), a.begin(), a.end());
  all.insert(all.end(), b.begin(), b.end());
  CHECK_EQ(foundry::image_content_hash(view.value()), foundry::hash64(all.data(), all.size()));

  // An empty (or absent) array leaves `data` as the single segment.
  const void* empty[] = {nullptr};
  Wrapper w1 = make_wrapper(2, kTinyFatbin, const_cast<void**>(empty));
  auto v1 = foundry::inspect_image(&w1, sizeof(w1));
  CHECK(v1.ok() && v1.value().segments.size() == 1 && v1.value().total_size == sizeof(kTinyFatbin));
  Wrapper w2 = make_wrapper(2, kTinyFatbin, nullptr);
  auto v2 = foundry::inspect_image(&w2, sizeof(w2));
  CHECK(v2.ok() && v2.value().segments.size() == 1);
  // A null `data` with prelinked fatbins: only those.
  Wrapper w3 = make_wrapper(2, nullptr, const_cast<void**>(prelinked));
  auto v3 = foundry::inspect_image(&w3, sizeof(w3));
  CHECK(v3.ok() && v3.value().segments.size() == 2);
  // Neither: refused.
  Wrapper w4 = make_wrapper(2, nullptr, nullptr);
  CHECK_EQ(foundry::inspect_image(&w4, sizeof(w4)).status().code(), FOUNDRY_ERR_FORMAT);
}

TEST_CASE("corrupt wrappers are refused without crashing") {
  Wrapper w = make_wrapper(1, kTinyFatbin, nullptr);
  for (size_t len = 0; len < sizeof(w); ++len) {
    auto buf = exact_copy(reinterpret_cast<const uint8_t*>(&w), len);
    CHECK(!foundry::inspect_image(buf.get(), len).ok());
  }
  Wrapper v3 = make_wrapper(3, kTinyFatbin, nullptr);
  CHECK_EQ(foundry::inspect_image(&v3, sizeof(v3)).status().code(), FOUNDRY_ERR_VERSION);
  Wrapper null_data = make_wrapper(1, nullptr, nullptr);
  CHECK_EQ(foundry::inspect_image(&null_data, sizeof(null_data)).status().code(), FOUNDRY_ERR_FORMAT);
  Wrapper not_fatbin = make_wrapper(1, kTinySm90Cubin, nullptr);
  CHECK_EQ(foundry::inspect_image(&not_fatbin, sizeof(not_fatbin)).status().code(), FOUNDRY_ERR_FORMAT);

  GuardedPage guard;
  CHECK(guard.base != nullptr);
  if (!guard.base) return;
  // Data pointing at inaccessible memory.
  Wrapper wild = make_wrapper(1, guard.inaccessible(), nullptr);
  auto r = foundry::inspect_image(&wild, sizeof(wild));
  CHECK(!r.ok() && r.status().message().find("not readable") != std::string::npos);
  // A container header at the end of the readable page claiming bytes that run into the
  // inaccessible one.
  uint8_t* tail = guard.inaccessible() - 16;
  std::memcpy(tail, kTinyFatbin, 16);
  Wrapper overhang = make_wrapper(1, tail, nullptr);
  r = foundry::inspect_image(&overhang, sizeof(overhang));
  CHECK(!r.ok() && r.status().message().find("not all readable") != std::string::npos);
  // A v2 array that runs into inaccessible memory without a terminator.
  const void** array = reinterpret_cast<const void**>(guard.inaccessible() - 2 * sizeof(void*));
  array[0] = kTinyFatbin;
  array[1] = kTinyFatbin;
  Wrapper unterminated = make_wrapper(2, kTinyFatbin, array);
  r = foundry::inspect_image(&unterminated, sizeof(unterminated));
  CHECK(!r.ok() && r.status().message().find("array entry 2") != std::string::npos);
  // A prelinked pointer into inaccessible memory.
  array[1] = guard.inaccessible();
  r = foundry::inspect_image(&unterminated, sizeof(unterminated));
  CHECK(!r.ok() && r.status().message().find("prelinked fatbin 1") != std::string::npos);
}

TEST_MAIN()
