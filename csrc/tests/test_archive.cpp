// Tests of the archive layer: byte encoding, the section container (including every truncation
// and every single-byte corruption of a small container) and atomic directory publishing.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "archive/atomic_dir.h"
#include "archive/bytes.h"
#include "archive/container.h"
#include "archive/file_bytes.h"
#include "common/hash.h"
#include "common/load_settings.h"
#include "tests/check.h"

using namespace foundry;

namespace {

// One scratch directory for the whole program, removed at exit.
const std::string& scratch() {
  static std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/foundry-test-archive.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) {
      std::perror("mkdtemp");
      return std::string("/nonexistent");
    }
    std::string made = buf.data();
    std::atexit([] { remove_tree(scratch()); });
    return made;
  }();
  return dir;
}

std::string fresh_dir(const std::string& name) {
  std::string d = scratch() + "/" + name;
  remove_tree(d);
  ::mkdir(d.c_str(), 0755);
  return d;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::set<std::string> list_names(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::vector<uint8_t> pseudo_random(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

uint64_t get64(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
  return v;
}
void put64(std::vector<uint8_t>* b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*b)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put32(std::vector<uint8_t>* b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*b)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// Recomputes the table and header checksums after a test edits the header or table, so that the
// structural checks behind them are what gets exercised.
void reseal(std::vector<uint8_t>* b) {
  uint32_t count = static_cast<uint32_t>((*b)[12] | (*b)[13] << 8 | (*b)[14] << 16 | (uint32_t{(*b)[15]} << 24));
  size_t table = std::min<size_t>(size_t{count} * 32, b->size() - 64);  // a hostile count overshoots
  put64(b, 24, hash64(b->data() + 64, table));
  put64(b, 32, hash64(b->data(), 32));
}

// A small container with a 5-byte section (so padding follows it), an empty one and an 11-byte one.
std::vector<uint8_t> small_container() {
  ContainerWriter w;
  w.add(7, bytes_of("hello"));
  w.add(8, {});
  w.add(9, bytes_of("world!12345"), 3);
  return w.finish();
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace

// ---- bytes.h ----------------------------------------------------------------------------------

TEST_CASE("bytes: round trip of every encoding") {
  ByteWriter w;
  w.u8(0xAB);
  w.u16(0xBEEF);
  w.u32(0xDEADBEEF);
  w.u64(0x0123456789ABCDEFull);
  w.i64(-42);
  w.f64(3.25);
  w.string("name");
  w.blob("\x00\x01\x02", 3);
  size_t patch_at = w.size();
  w.u64(0);
  w.raw("xyz", 3);
  CHECK(w.patch_u64(patch_at, 77));
  CHECK(!w.patch_u64(w.size() - 7, 1));  // would run past the end
  CHECK(!w.patch_u64(w.size() + 1, 1));
  CHECK_EQ(w.bytes()[1], 0xEF);  // little-endian

  ByteReader r(w.bytes().data(), w.size());
  uint8_t a;
  uint16_t b;
  uint32_t c;
  uint64_t d, patched;
  int64_t e;
  double f;
  std::string s;
  ByteSpan blob, tail;
  CHECK(r.u8(&a) && a == 0xAB);
  CHECK(r.u16(&b) && b == 0xBEEF);
  CHECK(r.u32(&c) && c == 0xDEADBEEF);
  CHECK(r.u64(&d) && d == 0x0123456789ABCDEFull);
  CHECK(r.i64(&e) && e == -42);
  CHECK(r.f64(&f) && f == 3.25);
  CHECK(r.string(&s, 100) && s == "name");
  CHECK(r.blob(&blob, 100) && blob.size == 3 && blob.data[2] == 2);
  CHECK(r.u64(&patched) && patched == 77);
  CHECK(r.bytes(3, &tail) && std::memcmp(tail.data, "xyz", 3) == 0);
  CHECK(r.at_end() && r.ok());
  CHECK(r.status("record").ok());
}

TEST_CASE("bytes: underflow is refused, sticky and named") {
  const uint8_t buf[6] = {1, 2, 3, 4, 5, 6};
  ByteReader r(buf, sizeof buf);
  uint32_t v;
  uint64_t w;
  CHECK(r.u32(&v) && v == 0x04030201);
  CHECK(!r.u64(&w));  // 2 bytes remain
  CHECK_EQ(r.offset(), 4u);
  uint8_t one;
  CHECK(!r.u8(&one));  // sticky even though a byte would fit
  Status st = r.status("widget");
  CHECK_EQ(st.code(), FOUNDRY_ERR_FORMAT);
  CHECK(contains(st.message(), "truncated widget at offset 4"));

  ByteReader empty(nullptr, 0);
  ByteSpan span;
  CHECK(empty.bytes(0, &span) && span.size == 0);
  CHECK(!empty.skip(1));
}

TEST_CASE("bytes: string and count limits are checked before allocating") {
  ByteWriter w;
  w.u64(1ull << 40);  // a hostile length
  ByteReader r(w.bytes().data(), w.size());
  std::string s;
  CHECK(!r.string(&s, 1 << 20));
  CHECK(contains(r.status("name").message(), "exceeds the limit"));

  ByteWriter w2;
  w2.string("abcdef");
  ByteReader r2(w2.bytes().data(), w2.size());
  CHECK(!r2.string(&s, 5));  // one byte over the limit

  ByteWriter w3;
  w3.u32(1000);
  w3.u64(0);
  ByteReader r3(w3.bytes().data(), w3.size());
  uint32_t n;
  CHECK(!r3.count32(&n, 8));  // 1000 elements of 8 bytes cannot fit in 8 bytes
  CHECK(contains(r3.status("node list").message(), "element count 1000"));
  ByteWriter w5;
  w5.u32(1);
  w5.u64(9);
  ByteReader r5(w5.bytes().data(), w5.size());
  CHECK(r5.count32(&n, 8) && n == 1);
}

// ---- container --------------------------------------------------------------------------------

TEST_CASE("container: round trip with empty, duplicate and large sections") {
  std::vector<uint8_t> large = pseudo_random(3 << 20, 1);
  ContainerWriter w;
  w.add(1, bytes_of("hello"));
  w.add(2, {});
  w.add(3, large, 0x55);
  w.add(2, bytes_of("second of type 2"));
  w.add(4, pseudo_random(13, 2));
  w.add(5, {});  // empty last section after an unaligned end
  std::vector<uint8_t> file = w.finish();

  Result<Container> r = Container::parse(file, "mem");
  CHECK(r.ok());
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().message().c_str());
    return;
  }
  const Container& c = r.value();
  CHECK_EQ(c.sections().size(), 6u);
  CHECK_EQ(c.file_size(), file.size());
  for (const Section& s : c) CHECK_EQ(s.offset % 8, 0u);
  CHECK(c.find(1) && c.data(*c.find(1)).to_vector() == bytes_of("hello"));
  CHECK(c.find(2) && c.find(2)->size == 0);
  CHECK_EQ(c.find_all(2).size(), 2u);
  CHECK(c.data(*c.find_all(2)[1]).to_vector() == bytes_of("second of type 2"));
  CHECK(c.find(3) && c.find(3)->flags == 0x55 && c.data(*c.find(3)).to_vector() == large);
  CHECK(c.find(5) && c.find(5)->size == 0);
  CHECK(c.find(99) == nullptr);

  Result<ByteReader> rd = c.reader(4);
  CHECK(rd.ok() && rd.value().remaining() == 13);
  CHECK_EQ(c.reader(99).status().code(), FOUNDRY_ERR_NOT_FOUND);

  // Zero sections is a valid (64-byte) container.
  std::vector<uint8_t> empty = ContainerWriter().finish();
  CHECK_EQ(empty.size(), 64u);
  Result<Container> e = Container::parse(empty, "empty");
  CHECK(e.ok() && e.value().sections().empty());
}

TEST_CASE("container: every truncation is refused as FORMAT") {
  std::vector<uint8_t> file = small_container();
  for (size_t len = 0; len < file.size(); ++len) {
    std::vector<uint8_t> cut(file.begin(), file.begin() + len);
    Result<Container> r = Container::parse(cut, "cut");
    CHECK(!r.ok());
    CHECK_EQ(r.status().code(), FOUNDRY_ERR_FORMAT);
    if (r.status().code() != FOUNDRY_ERR_FORMAT)
      std::fprintf(stderr, "length %zu: %d %s\n", len, r.status().code(), r.status().message().c_str());
  }
  Result<Container> r = Container::parse(std::vector<uint8_t>(file.begin(), file.end() - 1), "model.bin");
  CHECK(contains(r.status().message(), "model.bin: header: truncated"));

  std::vector<uint8_t> longer = file;
  longer.resize(file.size() + 8, 0);
  Result<Container> x = Container::parse(longer, "long");
  CHECK_EQ(x.status().code(), FOUNDRY_ERR_FORMAT);
  CHECK(contains(x.status().message(), "extended"));
}

TEST_CASE("container: a corrupted byte anywhere is refused") {
  const std::vector<uint8_t> file = small_container();
  const size_t table_end = 64 + 3 * 32;
  // region -> code -> count, printed as the report of which check catches what.
  std::map<std::string, std::map<int, int>> seen;
  for (size_t pos = 0; pos < file.size(); ++pos) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      std::vector<uint8_t> bad = file;
      bad[pos] ^= mask;
      Result<Container> r = Container::parse(bad, "flip");
      CHECK(!r.ok());
      std::string region = pos < 32   ? "header[0,32)"
                           : pos < 40 ? "header checksum"
                           : pos < 64 ? "header reserved"
                           : pos < table_end ? "table"
                                             : "data+padding";
      seen[region][r.status().code()]++;
      if (pos >= 64 && pos < table_end) CHECK_EQ(r.status().code(), FOUNDRY_ERR_MISMATCH);
    }
  }
  for (const auto& region : seen) {
    std::printf("  flips in %-16s:", region.first.c_str());
    for (const auto& code : region.second) std::printf(" code %d x%d", code.first, code.second);
    std::printf("\n");
  }
  // The data area: section bytes give MISMATCH, the padding after "hello" gives FORMAT.
  std::vector<uint8_t> bad = file;
  bad[table_end] ^= 1;  // first byte of "hello"
  CHECK_EQ(Container::parse(bad, "f").status().code(), FOUNDRY_ERR_MISMATCH);
  CHECK(contains(Container::parse(bad, "f").status().message(), "section 0 (type 7)"));
  bad = file;
  bad[table_end + 5] ^= 1;  // padding after "hello"
  CHECK_EQ(Container::parse(bad, "f").status().code(), FOUNDRY_ERR_FORMAT);
  CHECK(contains(Container::parse(bad, "f").status().message(), "padding"));
}

TEST_CASE("container: a newer version is refused as VERSION, naming both") {
  std::vector<uint8_t> file = small_container();
  put32(&file, 8, 2);
  reseal(&file);
  Result<Container> r = Container::parse(file, "new.bin");
  CHECK_EQ(r.status().code(), FOUNDRY_ERR_VERSION);
  CHECK(contains(r.status().message(), "version 2"));
  CHECK(contains(r.status().message(), "version 1"));
  put32(&file, 8, 0);
  reseal(&file);
  CHECK_EQ(Container::parse(file, "zero").status().code(), FOUNDRY_ERR_FORMAT);
}

TEST_CASE("container: foreign data is named as such") {
  std::vector<uint8_t> gif = bytes_of("GIF89a");
  gif.resize(200, 0);
  Result<Container> r = Container::parse(gif, "picture.gif");
  CHECK_EQ(r.status().code(), FOUNDRY_ERR_FORMAT);
  CHECK(contains(r.status().message(), "picture.gif"));
  CHECK(contains(r.status().message(), "not a Foundry container"));
  CHECK_EQ(Container::parse({}, "empty").status().code(), FOUNDRY_ERR_FORMAT);
  CHECK_EQ(Container::parse(bytes_of("FDRY"), "short").status().code(), FOUNDRY_ERR_FORMAT);
}

TEST_CASE("container: hostile tables with valid checksums are refused") {
  const std::vector<uint8_t> good = small_container();
  const size_t e0 = 64, e2 = 64 + 64;  // entries 0 and 2; offset at +8, size at +16
  auto expect = [&](std::vector<uint8_t> b, const char* needle) {
    reseal(&b);
    Result<Container> r = Container::parse(b, "hostile");
    CHECK_EQ(r.status().code(), FOUNDRY_ERR_FORMAT);
    CHECK(contains(r.status().message(), needle));
    if (!contains(r.status().message(), needle)) std::fprintf(stderr, "got: %s\n", r.status().message().c_str());
  };
  std::vector<uint8_t> b = good;
  put64(&b, e2 + 8, get64(good, e0 + 8));  // section 2 on top of section 0
  expect(b, "overlaps");
  b = good;
  put64(&b, e0 + 8, get64(good, e0 + 8) + 4);
  expect(b, "not 8-byte aligned");
  b = good;
  put64(&b, e2 + 16, ~0ull - 4);  // size that would overflow offset + size
  expect(b, "past the end");
  b = good;
  put64(&b, e2 + 8, ~0ull & ~7ull);
  expect(b, "past the end");
  b = good;
  put64(&b, e0 + 8, 64);  // inside the table
  expect(b, "inside the header or section table");
  b = good;
  put32(&b, 12, 0xFFFFFFFFu);  // absurd section count
  expect(b, "do not fit");
  b = good;
  b[60] = 1;  // reserved header byte (not checksummed)
  expect(b, "reserved");
}

TEST_CASE("container: files, symlinks and non-regular files") {
  std::string dir = fresh_dir("files");
  std::string path = dir + "/c.fdry";
  ContainerWriter w;
  w.add(1, bytes_of("payload"));
  w.add(2, pseudo_random(100000, 3));
  CHECK(write_container_file(path, w).ok());
  CHECK_EQ(list_names(dir), (std::set<std::string>{"c.fdry"}));  // no temporary left behind
  Result<Container> r = Container::read_file(path);
  CHECK(r.ok() && r.value().find(2) && r.value().find(2)->size == 100000);
  CHECK(r.ok() && r.value().name() == path);

  // Overwriting keeps exactly one file.
  w.add(3, {});
  CHECK(write_container_file(path, w).ok());
  CHECK(Container::read_file(path).ok() && Container::read_file(path).value().sections().size() == 3);

  std::string link = dir + "/link.fdry";
  CHECK_EQ(::symlink(path.c_str(), link.c_str()), 0);
  Result<Container> l = Container::read_file(link);
  CHECK_EQ(l.status().code(), FOUNDRY_ERR_IO);
  CHECK(contains(l.status().message(), "symbolic link"));

  CHECK_EQ(Container::read_file(dir).status().code(), FOUNDRY_ERR_IO);
  std::string fifo = dir + "/fifo";
  CHECK_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  Result<Container> f = Container::read_file(fifo);  // must not hang
  CHECK_EQ(f.status().code(), FOUNDRY_ERR_IO);
  CHECK(contains(f.status().message(), "not a regular file"));

  CHECK_EQ(Container::read_file(dir + "/missing").status().code(), FOUNDRY_ERR_NOT_FOUND);
  Result<Container> big = Container::read_file(path, 1000);
  CHECK_EQ(big.status().code(), FOUNDRY_ERR_FORMAT);
  CHECK(contains(big.status().message(), "limit"));

  // A corrupt file names the file.
  write_text(dir + "/junk", "this is not a container at all, not even close........................");
  Result<Container> j = Container::read_file(dir + "/junk");
  CHECK(contains(j.status().message(), dir + "/junk: header: not a Foundry container"));
}

TEST_CASE("file bytes: mapped and copied reads hold the same bytes; a truncated file is refused either way") {
  std::string dir = fresh_dir("filebytes");
  std::string path = dir + "/c.fdry";
  ContainerWriter w;
  w.add(1, pseudo_random(300000, 5));
  w.add(2, bytes_of("tail"));
  CHECK(write_container_file(path, w).ok());
  std::vector<uint8_t> expected = w.finish();

  set_map_archive_files(true);
  Result<FileBytes> mapped = FileBytes::read(path, 1u << 30);
  CHECK(mapped.ok() && mapped.value().mapped());
  set_map_archive_files(false);  // FOUNDRY_READ_MAP=0
  Result<FileBytes> copied = FileBytes::read(path, 1u << 30);
  set_map_archive_files(true);
  CHECK(copied.ok() && !copied.value().mapped());
  for (const Result<FileBytes>* r : {&mapped, &copied}) {
    CHECK(r->ok() && r->value().size() == expected.size() &&
          std::memcmp(r->value().data(), expected.data(), expected.size()) == 0);
  }

  // Moving keeps the bytes where they are (the mapping or the buffer travels, not a copy).
  const uint8_t* at = mapped.value().data();
  FileBytes moved = std::move(mapped.value());
  CHECK(moved.data() == at && moved.mapped() && moved.size() == expected.size());
  FileBytes assigned;
  assigned = std::move(moved);
  CHECK(assigned.data() == at && moved.data() == nullptr && moved.size() == 0);

  // An empty file is not mapped (nothing to map) and is named as foreign by the container.
  write_text(dir + "/empty", "");
  Result<FileBytes> empty = FileBytes::read(dir + "/empty", 100);
  CHECK(empty.ok() && empty.value().size() == 0 && !empty.value().mapped());
  CHECK_EQ(Container::read_file(dir + "/empty").status().code(), FOUNDRY_ERR_FORMAT);

  // Truncated on disk before the read: both ways report the truncation, neither faults.
  CHECK_EQ(::truncate(path.c_str(), static_cast<off_t>(expected.size() - 100)), 0);
  for (bool map : {true, false}) {
    set_map_archive_files(map);
    Result<Container> t = Container::read_file(path);
    CHECK_EQ(t.status().code(), FOUNDRY_ERR_FORMAT);
    CHECK(contains(t.status().message(), "truncated"));
  }
  set_map_archive_files(true);
}

// ---- atomic_dir -------------------------------------------------------------------------------

TEST_CASE("staging: publish creates, then replaces an existing directory") {
  std::string parent = fresh_dir("publish");
  std::string final_path = parent + "/archive";
  {
    Result<StagingDir> r = StagingDir::create(final_path);
    CHECK(r.ok());
    StagingDir s = std::move(r.value());
    CHECK(s.path().rfind(parent + "/.archive.staging.", 0) == 0);
    CHECK(!exists(final_path));
    CHECK(::mkdir((s.path() + "/sub").c_str(), 0755) == 0);
    write_text(s.path() + "/sub/old.txt", "old");
    write_text(s.path() + "/manifest", "v1");
    Status p = s.publish();
    CHECK(p.ok());
    if (!p.ok()) std::fprintf(stderr, "%s\n", p.message().c_str());
    CHECK(s.published());
    CHECK_EQ(s.publish().code(), FOUNDRY_ERR_STATE);  // only once
  }
  CHECK_EQ(read_text(final_path + "/manifest"), "v1");
  CHECK_EQ(list_names(parent), (std::set<std::string>{"archive"}));

  {
    Result<StagingDir> r = StagingDir::create(final_path);
    CHECK(r.ok());
    write_text(r.value().path() + "/manifest", "v2");
    CHECK(exists(final_path + "/sub/old.txt"));  // readers still see the old one
    CHECK(r.value().publish().ok());
  }
  CHECK_EQ(read_text(final_path + "/manifest"), "v2");
  CHECK(!exists(final_path + "/sub"));  // no mix of old and new
  CHECK_EQ(list_names(parent), (std::set<std::string>{"archive"}));  // old directory removed

  // A non-directory in the way is not replaced.
  std::string file_path = parent + "/plain";
  write_text(file_path, "keep");
  {
    Result<StagingDir> r = StagingDir::create(file_path);
    CHECK(r.ok());
    CHECK(!r.value().publish().ok());
  }
  CHECK_EQ(read_text(file_path), "keep");
  CHECK_EQ(list_names(parent), (std::set<std::string>{"archive", "plain"}));
}

TEST_CASE("staging: an unpublished directory is cleaned up and leaves no final directory") {
  std::string parent = fresh_dir("unpublished");
  std::string final_path = parent + "/archive";
  std::string staged;
  {
    Result<StagingDir> r = StagingDir::create(final_path);
    CHECK(r.ok());
    staged = r.value().path();
    CHECK(exists(staged));
    write_text(staged + "/partial", "half");
    StagingDir moved = std::move(r.value());  // the moved-from one must not delete it
    CHECK(exists(staged));
  }
  CHECK(!exists(staged));
  CHECK(!exists(final_path));
  CHECK(list_names(parent).empty());

  CHECK_EQ(StagingDir::create(parent + "/no/such/parent/x").status().code(), FOUNDRY_ERR_NOT_FOUND);
  CHECK_EQ(StagingDir::create(parent + "/..").status().code(), FOUNDRY_ERR_INVALID_ARGUMENT);
}

TEST_CASE("remove_tree does not follow symlinks") {
  std::string root = fresh_dir("remove");
  std::string outside = root + "/outside";
  ::mkdir(outside.c_str(), 0755);
  write_text(outside + "/precious", "x");
  std::string tree = root + "/tree";
  ::mkdir(tree.c_str(), 0755);
  ::mkdir((tree + "/a").c_str(), 0755);
  write_text(tree + "/a/f", "y");
  CHECK_EQ(::symlink(outside.c_str(), (tree + "/a/link").c_str()), 0);
  CHECK_EQ(::symlink((outside + "/precious").c_str(), (tree + "/flink").c_str()), 0);
  CHECK(remove_tree(tree).ok());
  CHECK(!exists(tree));
  CHECK_EQ(read_text(outside + "/precious"), "x");
  CHECK(remove_tree(tree).ok());  // already gone

  // A symlink given as the root is removed itself.
  std::string link = root + "/rootlink";
  CHECK_EQ(::symlink(outside.c_str(), link.c_str()), 0);
  CHECK(remove_tree(link).ok());
  CHECK(!exists(link) && exists(outside + "/precious"));
}

TEST_CASE("write_file_atomic and fsync_path") {
  std::string dir = fresh_dir("atomic");
  std::string path = dir + "/f";
  CHECK(write_file_atomic(path, "abc", 3).ok());
  CHECK(write_file_atomic(path, "defg", 4).ok());
  CHECK_EQ(read_text(path), "defg");
  CHECK_EQ(list_names(dir), (std::set<std::string>{"f"}));
  CHECK(write_file_atomic(dir + "/empty", nullptr, 0).ok());
  CHECK_EQ(read_text(dir + "/empty"), "");
  CHECK(fsync_path(path).ok());
  CHECK(fsync_path(dir).ok());
  CHECK_EQ(fsync_path(dir + "/missing").code(), FOUNDRY_ERR_IO);
  CHECK_EQ(write_file_atomic(dir + "/missing/f", "x", 1).code(), FOUNDRY_ERR_IO);
}

TEST_CASE("safe_join") {
  Result<std::string> ok = safe_join("/a/b", "images/x.cubin");
  CHECK(ok.ok() && ok.value() == "/a/b/images/x.cubin");
  CHECK(safe_join("/a/b/", "f").value() == "/a/b/f");
  CHECK(safe_join("/a", ".hidden").ok());
  CHECK(safe_join("/a", "a..b").ok());
  const std::vector<std::string> refused = {"",     "/etc/passwd", "..",  "../x", "x/..", "x/../y",
                                            "x//y", "x/",          "./x", "x/.",  std::string("a\0b", 3)};
  for (const std::string& bad : refused) {
    Result<std::string> r = safe_join("/a", bad);
    CHECK(!r.ok());
    CHECK_EQ(r.status().code(), FOUNDRY_ERR_FORMAT);
  }
}

TEST_MAIN()
