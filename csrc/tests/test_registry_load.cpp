// Registry::load_dir against a fake driver (fake_driver/fake_cuda.cpp, which the core's dlopen
// finds first on LD_LIBRARY_PATH, see CMakeLists.txt): each archived image ends up as one record
// and one loaded module, whatever the order of lazy reads, eager loads, the process's own loads
// and failures, on one thread or several. The registry is the process's, shared by every case:
// each case writes images of its own bytes and compares counts before and after.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "archive/atomic_dir.h"
#include "common/hash.h"
#include "common/load_settings.h"
#include "modules/image_file.h"
#include "modules/registry.h"
#include "tests/check.h"

using namespace foundry;

// The fake driver's controls.
extern "C" {
void fake_expect_context(CUcontext ctx);
long fake_wrong_context_loads();
long fake_loads();
long fake_live_modules();
void fake_rendezvous(int n);
bool fake_rendezvous_met();
}

namespace {

// LOAD's context: the test's thread has it current, and every module must go into it.
const CUcontext kContext = reinterpret_cast<CUcontext>(0x7000);

struct Image {
  std::vector<uint8_t> bytes;
  uint64_t hash = 0;
};

// The fake refuses an image whose text starts with "FAIL " and holds one that goes on "PAIR " at
// its rendezvous (fake_cuda.cpp).
Image image(const std::string& text) {
  Image im;
  im.bytes.assign(text.begin(), text.end());
  Hasher64 h;  // the registry's content hash of a one-segment image
  h.update(im.bytes.data(), im.bytes.size());
  im.hash = h.digest();
  return im;
}

// A scratch archive directory, removed at the end of the case.
struct Archive {
  std::string dir;

  Archive() {
    char tmpl[] = "/tmp/foundry-test-registry.XXXXXX";
    dir = ::mkdtemp(tmpl) ? tmpl : "/nonexistent";
    ::mkdir((dir + "/images").c_str(), 0755);
  }
  ~Archive() { remove_tree(dir); }

  std::string file(const Image& im) const { return dir + "/images/" + image_file_name(im.hash); }

  void add(const Image& im) {
    ImageFileInfo info;
    info.hash = im.hash;
    info.size = im.bytes.size();
    info.kind = FOUNDRY_IMAGE_CUBIN;
    info.loader = static_cast<uint32_t>(Loader::kModule);
    info.entries = {"k"};
    info.segments = {im.bytes};
    CHECK(write_image_file(file(im), info).ok());
  }

  std::vector<Image> add_images(const std::string& tag, int n) {
    std::vector<Image> images;
    for (int i = 0; i < n; ++i) images.push_back(image(tag + " " + std::to_string(i)));
    for (const Image& im : images) add(im);
    return images;
  }
};

// Gives this thread LOAD's context and sets the image threads as FOUNDRY_IMAGE_THREADS would
// (nullptr: not set, the default). Returns a tag that keeps the case's images apart from others'.
std::string start(const std::string& name, const char* threads) {
  cuCtxSetCurrent(kContext);
  fake_expect_context(kContext);
  set_image_threads_setting(threads != nullptr ? std::strtoul(threads, nullptr, 10) : 0);
  return name + " threads=" + (threads ? threads : "default");
}

// Whether load_dir runs on two threads at least, with FOUNDRY_IMAGE_THREADS=`threads` (it uses no
// more than the machine's hardware threads).
bool several_threads(const char* threads) {
  return threads != nullptr && std::atoi(threads) > 1 && std::thread::hardware_concurrency() >= 2;
}

struct Counts {
  long records, modules, loads;
};

Counts now() { return {static_cast<long>(Registry::instance().count()), fake_live_modules(), fake_loads()}; }

Counts since(const Counts& before) {
  Counts n = now();
  return {n.records - before.records, n.modules - before.modules, n.loads - before.loads};
}

// The process's own load of `im`, as the interposer makes it (load_through_registry): an identical
// archived image's handle, else the driver's load, registered.
CUmodule process_load(const Image& im) {
  PendingImage p;
  p.parsed = true;
  p.kind = FOUNDRY_IMAGE_CUBIN;
  p.size = im.bytes.size();
  p.owned.push_back(im.bytes);
  p.segments.emplace_back(p.owned.back().data(), p.owned.back().size());
  void* archived = nullptr;
  if (Registry::instance().find_archived(p, Loader::kModule, &archived)) return static_cast<CUmodule>(archived);
  CUmodule mod = nullptr;
  if (cuModuleLoadData(&mod, im.bytes.data()) != CUDA_SUCCESS) return nullptr;
  Registry::instance().add(std::move(p), Loader::kModule, mod);
  return mod;
}

CUfunction function_of(CUmodule mod) {
  CUfunction f = nullptr;
  cuModuleGetFunction(&f, mod, "k");
  return f;
}

bool resolves(const Image& im) { return Registry::instance().resolve(im.hash, "k").ok(); }

}  // namespace

TEST_CASE("a directory loaded twice: the second load loads nothing, each image is held once") {
  for (const char* threads : {static_cast<const char*>(nullptr), "4"}) {
    Archive a;
    a.add_images(start("twice", threads), 6);
    Counts before = now();
    auto first = Registry::instance().load_dir(a.dir);
    auto second = Registry::instance().load_dir(a.dir);
    CHECK(first.ok() && first.value() == 6);
    CHECK(second.ok() && second.value() == 0);
    Counts d = since(before);
    CHECK_EQ(d.records, 6);
    CHECK_EQ(d.modules, 6);
    CHECK_EQ(d.loads, 6);
  }
}

TEST_CASE("a file already loaded is not read again: its name stands for its content") {
  Archive a;
  std::vector<Image> images = a.add_images(start("not read twice", nullptr), 3);
  CHECK(Registry::instance().load_dir(a.dir).ok());
  // The loaded images' files made unreadable: a second load must not need them.
  for (const Image& im : images) CHECK(::truncate((a.dir + "/images/" + image_file_name(im.hash)).c_str(), 3) == 0);
  auto again = Registry::instance().load_dir(a.dir);
  CHECK(again.ok() && again.value() == 0);
  uint64_t hash = 0;
  CHECK(image_file_hash("/x/images/" + image_file_name(0x0123456789abcdefULL), &hash) && hash == 0x0123456789abcdefULL);
  CHECK(!image_file_hash("/x/images/0123456789ABCDEF.fimg", &hash));
  CHECK(!image_file_hash("/x/images/0123.fimg", &hash));
}

TEST_CASE("an eager load after a lazy read loads the records read, once") {
  for (const char* threads : {static_cast<const char*>(nullptr), "4"}) {
    Archive a;
    std::vector<Image> images = a.add_images(start("lazy then eager", threads), 6);
    Counts before = now();
    auto lazy = Registry::instance().load_dir(a.dir, true);
    Counts read = since(before);
    CHECK(lazy.ok() && lazy.value() == 6);
    CHECK_EQ(read.records, 6);
    CHECK_EQ(read.loads, 0);
    auto eager = Registry::instance().load_dir(a.dir, false);
    CHECK(eager.ok() && eager.value() == 6);  // loading a lazily read image counts as loading it
    Counts d = since(before);
    CHECK_EQ(d.records, 6);
    CHECK_EQ(d.modules, 6);
    CHECK_EQ(d.loads, 6);
    for (const Image& im : images) CHECK(resolves(im));
  }
}

TEST_CASE("a failing image: the error names it, the images before it stay, none after it") {
  for (const char* threads : {static_cast<const char*>(nullptr), "4"}) {
    Archive a;
    std::string tag = start("fail in the middle", threads);
    // On threads, the failing image waits for a later one to be loading, which must then be
    // unloaded again.
    const bool paired = several_threads(threads);
    const std::string pair = paired ? "OKAY PAIR " : "";
    Image bad = image((paired ? "FAIL PAIR " : "FAIL ") + tag);
    // Files are loaded in name order, and a name is the hash in fixed-width hex: three images
    // sort before the failing one and three after it (the hashes are fixed: a few tries).
    std::vector<Image> before, after;
    for (int i = 0; i < 1000 && (before.size() < 3 || after.size() < 3); ++i) {
      Image plain = image(tag + " " + std::to_string(i)), partner = image(pair + tag + " " + std::to_string(i));
      if (plain.hash < bad.hash && before.size() < 3) before.push_back(plain);
      if (partner.hash > bad.hash && after.size() < 3) after.push_back(partner);
    }
    for (const std::vector<Image>* side : {&before, &after})
      for (const Image& im : *side) a.add(im);
    a.add(bad);
    if (paired) fake_rendezvous(2);
    Counts at_start = now();
    auto r = Registry::instance().load_dir(a.dir);
    CHECK(!r.ok());
    CHECK(r.status().message().find(a.file(bad)) != std::string::npos);
    Counts d = since(at_start);
    CHECK_EQ(d.records, 3);
    CHECK_EQ(d.modules, 3);  // later images loaded on other threads meanwhile were unloaded
    if (threads == nullptr) CHECK_EQ(d.loads, 4);  // one at a time, none is started after the failure
    if (paired) CHECK(fake_rendezvous_met());
    for (const Image& im : before) CHECK(resolves(im));
    for (const Image& im : after) CHECK(!resolves(im));
    CHECK(!resolves(bad));
  }
}

TEST_CASE("on threads, every image is loaded in the caller's context") {
  Archive a;
  a.add_images("OKAY PAIR " + start("context", "4"), 8);
  // Two loads wait for each other: a thread that load_dir started loads an image.
  const bool several = several_threads("4");
  if (several) fake_rendezvous(2);
  long wrong = fake_wrong_context_loads();
  auto r = Registry::instance().load_dir(a.dir);
  CHECK(r.ok() && r.value() == 8);
  if (several) CHECK(fake_rendezvous_met());
  CHECK_EQ(fake_wrong_context_loads() - wrong, 0);
  // The fake does see a load on a thread without the context (a new thread has none).
  std::thread([] {
    CUmodule mod = nullptr;
    if (cuModuleLoadData(&mod, "a load with no context") == CUDA_SUCCESS) cuModuleUnload(mod);
  }).join();
  CHECK_EQ(fake_wrong_context_loads() - wrong, 1);
}

TEST_CASE("the process's own copy of an image loaded before LOAD is the one resolved") {
  Archive a;
  Image im = image(start("own copy first", nullptr));
  a.add(im);
  CUmodule own = process_load(im);
  CHECK(own != nullptr);
  auto r = Registry::instance().load_dir(a.dir);
  CHECK(r.ok() && r.value() == 1);
  auto f = Registry::instance().resolve(im.hash, "k");
  CHECK(f.ok() && f.value() == function_of(own));
}

TEST_CASE("the process's load of an image LOAD loaded before gets the archived handle") {
  Archive a;
  Image im = image(start("archive first", nullptr));
  a.add(im);
  auto r = Registry::instance().load_dir(a.dir);
  CHECK(r.ok() && r.value() == 1);
  Counts before = now();
  CUmodule got = process_load(im);
  CHECK(got != nullptr && Registry::instance().is_archived_handle(got, Loader::kModule));
  Counts d = since(before);
  CHECK_EQ(d.loads, 0);
  CHECK_EQ(d.records, 0);
  auto f = Registry::instance().resolve(im.hash, "k");
  CHECK(f.ok() && f.value() == function_of(got));
}

TEST_MAIN()
