// CPU benchmark of the payload read that GraphSet::open does (times_.read_s): a synthetic
// graphs.fgr shaped like the 8B decode archive of bench/results (256 graphs, 27 templates holding
// 50715 nodes, ~1880 nodes per graph, 96% kernel nodes and 4% memset nodes, ~83 MiB), written
// once, then read again and again with the file in the page cache. Built with the tests
// (FOUNDRY_BUILD_TESTS=ON) but not run by ctest:
//
//   bench_payload_read [--reps N] [--keep PATH] [--delta-bytes B]
//
// Prints milliseconds per step (median and minimum over the repetitions). The last two rows ask
// whether MAP_POPULATE pays when the checksums are computed on several threads anyway.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/load_settings.h"
#include "archive/container.h"
#include "archive/file_bytes.h"
#include "common/hash.h"
#include "common/parallel.h"
#include "graph/payload.h"
#include "graph/serialize.h"
#include "graph/topology.h"

using namespace foundry;

namespace {

// The real archive's shape (bench/results/README.md and the LOAD log).
constexpr uint32_t kMembers = 256;
constexpr uint32_t kTemplates = 27;
constexpr uint32_t kTemplateNodes = 50715;  // in all 27 templates
constexpr uint32_t kNames = 220;            // distinct kernel entry names
constexpr uint32_t kImages = 164;

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }
};

void put64(std::vector<uint8_t>* v, size_t at, uint64_t x) {
  for (int i = 0; i < 8 && at + i < v->size(); ++i) (*v)[at + i] = static_cast<uint8_t>(x >> (8 * i));
}

// A kernel node like ATen's eager kernels: a parameter buffer of pointers and sizes, mostly
// non-zero in its first part (the rest: unused offset-calculator slots, zero).
Node kernel_node(Rng& rng, const std::vector<std::string>& names, const std::vector<uint64_t>& images) {
  static const uint32_t kParamSizes[] = {24, 40, 64, 96, 136, 200, 264, 344, 440};
  Node n;
  n.kind = NodeKind::kKernel;
  KernelNode& k = n.kernel;
  k.image_hash = images[rng.below(kImages)];
  k.name = names[rng.below(kNames)];
  k.grid[0] = 1 + rng.below(1024), k.grid[1] = 1 + rng.below(4), k.grid[2] = 1;
  k.block[0] = 128u << rng.below(3);
  k.shared_mem = rng.below(4) == 0 ? 16384 : 0;
  uint32_t size = kParamSizes[rng.below(9)];
  k.params.assign(size, 0);
  uint32_t live = std::max<uint32_t>(16, size * (40 + rng.below(40)) / 100) & ~7u;
  for (uint32_t off = 0; off + 8 <= live; off += 8) {
    bool pointer = rng.below(3) != 0;
    put64(&k.params, off, pointer ? 0x7f0000000000ull + (rng.next() & 0xffffffff00ull) : 1 + rng.below(65536));
  }
  for (uint32_t off = 0; off < size; off += 8) k.slots.push_back(ParamSlot{off, std::min<uint32_t>(8, size - off)});
  k.func.max_dynamic_shared = k.shared_mem;
  return n;
}

Node memset_node(Rng& rng) {
  Node n;
  n.kind = NodeKind::kMemset;
  n.memset.dst = 0x7f0000000000ull + (rng.next() & 0xffffff00ull);
  n.memset.element_size = 4;
  n.memset.width = 1 + rng.below(1 << 20);
  return n;
}

GraphModel make_template(Rng& rng, uint32_t nodes, const std::vector<std::string>& names,
                         const std::vector<uint64_t>& images) {
  GraphModel g;
  for (uint32_t j = 0; j < nodes; ++j) g.nodes.push_back(j % 27 == 13 ? memset_node(rng) : kernel_node(rng, names, images));
  for (uint32_t j = 0; j + 1 < nodes; ++j) {
    g.edges.push_back(Edge{j, j + 1, 0, 0, 0});
    if (j % 10 == 0 && j + 2 < nodes) g.edges.push_back(Edge{j, j + 2, 0, 0, 0});
  }
  return g;
}

// A member of template t: every node changed (another batch size moves the grid and the
// activation pointers), the kernel parameters in two runs of about delta_bytes/2 each.
std::vector<NodeDelta> make_member_delta(Rng& rng, const GraphModel& t, uint32_t m, uint32_t delta_bytes) {
  std::vector<NodeDelta> d;
  for (uint32_t j = 0; j < t.nodes.size(); ++j) {
    Node v = t.nodes[j];
    if (v.kind == NodeKind::kMemset) {
      v.memset.dst += 4096ull * (m + 1);
      v.memset.width += m + 1;
    } else {
      KernelNode& k = v.kernel;
      k.grid[0] += m + 1;
      uint32_t size = static_cast<uint32_t>(k.params.size());
      uint32_t want = std::min<uint32_t>(size, delta_bytes / 2 + rng.below(delta_bytes + 1));
      uint32_t first = std::min<uint32_t>(want, std::max<uint32_t>(8, want / 2));
      uint32_t second = want - first;
      for (uint32_t b = 0; b < first; ++b) k.params[b] ^= static_cast<uint8_t>(0x5a + m);
      // The second run starts past a gap of more than 8 unchanged bytes when there is room.
      uint32_t start = std::min<uint32_t>(size - second, first + 16);
      for (uint32_t b = 0; b < second; ++b) k.params[start + b] ^= static_cast<uint8_t>(0xa5 + m);
    }
    d.push_back(NodeDelta{j, std::move(v)});
  }
  return d;
}

Payload make_payload(uint32_t delta_bytes) {
  Rng rng{42};
  std::vector<std::string> names;
  for (uint32_t i = 0; i < kNames; ++i) {
    std::string s = "_ZN2at6native" + std::to_string(i) + "_GLOBAL__N_1";
    while (s.size() < 120 + i % 140) s += "29vectorized_elementwise_kernelILi4ENS0_";
    names.push_back(s);
  }
  std::vector<uint64_t> images;
  for (uint32_t i = 0; i < kImages; ++i) images.push_back(rng.next());

  Payload p;
  p.region_base = 0x7f0000000000ull;
  p.region_size = 64ull << 30;
  for (uint32_t t = 0; t < kTemplates; ++t) {
    uint32_t nodes = kTemplateNodes / kTemplates + (t < kTemplateNodes % kTemplates ? 1 : 0);
    p.templates.push_back(make_template(rng, nodes, names, images));
  }
  for (uint32_t m = 0; m < kMembers; ++m) {
    PayloadMember pm;
    pm.name = "decode_bs" + std::to_string(m + 1);
    pm.template_index = m * kTemplates / kMembers;
    // The first member of each template is the template itself: an empty delta.
    bool is_template = m == 0 || (m - 1) * kTemplates / kMembers != pm.template_index;
    if (!is_template) pm.delta = make_member_delta(rng, p.templates[pm.template_index], m, delta_bytes);
    for (uint32_t r = 0; r < 40; ++r) pm.refs.push_back(RegionRef{(m * 40ull + r) << 21, 2ull << 20, 1});
    p.members.push_back(std::move(pm));
  }
  return p;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Row {
  std::string name;
  std::vector<double> ms;
};

void die(const Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 9;
  uint32_t delta_bytes = 140;
  std::string path = "/tmp/foundry-bench-payload-" + std::to_string(::getpid()) + ".fgr";
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--delta-bytes" && i + 1 < argc) delta_bytes = static_cast<uint32_t>(std::atoi(argv[++i]));
    else if (a == "--keep" && i + 1 < argc) path = argv[++i], keep = true;
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--keep PATH] [--delta-bytes B]\n", argv[0]);
      return 2;
    }
  }

  {
    auto t0 = std::chrono::steady_clock::now();
    Payload p = make_payload(delta_bytes);
    die(write_payload(path, p), "write_payload");
    std::printf("wrote %s in %.0f ms\n", path.c_str(), ms_since(t0));
  }

  // The file's shape, from the container itself.
  {
    auto c = Container::read_file(path);
    die(c.status(), "read");
    uint64_t tmpl = 0, member = 0, other = 0;
    for (const Section& s : c.value()) (s.type == 2 ? tmpl : s.type == 3 ? member : other) += s.size;
    auto p = parse_payload(c.value(), path, DeltaRead::kNow);
    die(p.status(), "parse");
    size_t nodes = 0, deltas = 0, kernels = 0, memsets = 0;
    for (const PayloadMember& m : p.value().members) {
      const GraphModel& t = p.value().templates[m.template_index];
      nodes += t.nodes.size();
      deltas += m.delta.size();
      for (const Node& n : t.nodes) (n.kind == NodeKind::kKernel ? kernels : memsets) += 1;
    }
    std::printf("file %.1f MiB: templates %.1f MiB, members %.1f MiB, other %.0f KiB; %zu sections\n",
                c.value().file_size() / 1048576.0, tmpl / 1048576.0, member / 1048576.0, other / 1024.0,
                c.value().sections().size());
    std::printf("%zu graphs, %zu templates (%d nodes), %zu nodes in all (%zu kernel, %zu memset), "
                "%zu delta entries (%.0f bytes each), %u hardware threads\n",
                p.value().members.size(), p.value().templates.size(), kTemplateNodes, nodes, kernels, memsets, deltas,
                static_cast<double>(member) / std::max<size_t>(deltas, 1), std::thread::hardware_concurrency());
  }

  std::vector<Row> rows;
  auto row = [&](const std::string& name) -> std::vector<double>& {
    for (Row& r : rows) if (r.name == name) return r.ms;
    rows.push_back(Row{name, {}});
    return rows.back().ms;
  };

  for (int rep = 0; rep < reps; ++rep) {
    // 1. The file's bytes: mapped (the default) and copied (FOUNDRY_READ_MAP=0).
    {
      auto t0 = std::chrono::steady_clock::now();
      auto fb = FileBytes::read(path, kDefaultMaxContainerSize);
      row("FileBytes::read (mmap, MAP_POPULATE)").push_back(ms_since(t0));
      die(fb.status(), "FileBytes::read");
      t0 = std::chrono::steady_clock::now();
      fb = Result<FileBytes>(FileBytes());
      row("  munmap of it").push_back(ms_since(t0));
      set_map_archive_files(false);
      t0 = std::chrono::steady_clock::now();
      auto copied = FileBytes::read(path, kDefaultMaxContainerSize);
      row("FileBytes::read (copy, FOUNDRY_READ_MAP=0)").push_back(ms_since(t0));
      set_map_archive_files(true);
      die(copied.status(), "FileBytes::read copy");
    }
    // 2. Container::read_file: the read, then header, table, layout and every section's checksum.
    auto t0 = std::chrono::steady_clock::now();
    auto c = Container::read_file(path);
    double read_file_ms = ms_since(t0);
    die(c.status(), "Container::read_file");
    row("Container::read_file (read + validate)").push_back(read_file_ms);
    const Container& cont = c.value();
    // 3. The checksums alone, as Container::parse does them (one thread, section by section).
    t0 = std::chrono::steady_clock::now();
    uint64_t sink = 0;
    for (const Section& s : cont) {
      ByteSpan b = cont.data(s);
      sink ^= hash64(b.data, b.size);
    }
    row("  XXH64 of every section (1 thread)").push_back(ms_since(t0));
    t0 = std::chrono::steady_clock::now();
    for (const Section& s : cont) {
      if (s.type != 3) continue;
      ByteSpan b = cont.data(s);
      sink ^= hash64(b.data, b.size);
    }
    row("  XXH64 of the member sections").push_back(ms_since(t0));
    // 4. parse_payload, deltas left for later (lazy LOAD) and all read now (eager LOAD).
    // Parses the payload one way, times it, and then times freeing what it built.
    auto timed_parse = [&](DeltaRead deltas, const char* label, const char* phase, const char* freeing) {
      auto t1 = std::chrono::steady_clock::now();
      auto parsed = parse_payload(cont, path, deltas);
      double parse_ms = ms_since(t1);
      die(parsed.status(), label);
      row(label).push_back(parse_ms);
      row(phase).push_back(read_file_ms + parse_ms);
      t1 = std::chrono::steady_clock::now();
      parsed = Result<Payload>(Payload());
      row(freeing).push_back(ms_since(t1));
    };
    timed_parse(DeltaRead::kLater, "parse_payload(kLater)", "= lazy read phase (read_file + kLater)",
                "  freeing the kLater payload");
    // Its parts, one at a time: the templates (read_graph, as parse_payload calls it) ...
    t0 = std::chrono::steady_clock::now();
    {
      std::vector<std::string> names;
      auto nr = cont.reader(4);
      die(read_names(nr.value(), &names), "names");
      std::vector<GraphModel> models(kTemplates);
      size_t t = 0;
      for (const Section* s : cont.find_all(2)) {
        ByteReader r(cont.data(*s));
        die(read_graph(r, &models[t++], 0, &names), "template");
      }
      row("  names + 27 templates, 1 thread").push_back(ms_since(t0));
      t0 = std::chrono::steady_clock::now();
    }
    row("  freeing those 27 templates").push_back(ms_since(t0));
    // ... and the pending deltas' copy: into a zeroed buffer (std::vector<uint8_t>::resize) and
    // into one left unwritten, each on one thread.
    auto copy_members = [&](auto* pending, const char* label) {
      auto t1 = std::chrono::steady_clock::now();
      size_t total = 0;
      for (const Section* s : cont.find_all(3)) total += s->size;
      pending->resize(total);
      size_t at = 0;
      for (const Section* s : cont.find_all(3)) {
        ByteSpan b = cont.data(*s);
        if (b.size) std::memcpy(pending->data() + at, b.data, b.size);
        at += b.size;
      }
      sink ^= (*pending)[total / 2];
      row(label).push_back(ms_since(t1));
    };
    {
      std::vector<uint8_t> zeroed;
      copy_members(&zeroed, "  copy of the member bytes, zeroed buffer");
    }
    {
      std::vector<uint8_t, DefaultInitAllocator<uint8_t>> unwritten;
      copy_members(&unwritten, "  copy of the member bytes, unzeroed buffer");
    }
    // 5. Every delta read now.
    timed_parse(DeltaRead::kNow, "parse_payload(kNow)", "= eager read phase (read_file + kNow)",
                "  freeing the kNow payload");
    // 6. One member's pending delta at first use (what lazy LOAD pays per graph it reaches).
    {
      auto p = parse_payload(cont, path, DeltaRead::kLater);
      die(p.status(), "parse_payload kLater");
      t0 = std::chrono::steady_clock::now();
      die(read_pending_delta(&p.value(), kMembers - 1, path), "read_pending_delta");
      row("read_pending_delta of one graph").push_back(ms_since(t0));
    }
    t0 = std::chrono::steady_clock::now();
    c = Result<Container>(Container());
    row("Container destructor (munmap)").push_back(ms_since(t0));
    // 7. Whether MAP_POPULATE pays: the file mapped with and without it, then every section hashed
    // on the threads Container::parse uses (without it, those threads take the page faults).
    std::vector<Section> sections;
    {
      auto again = Container::read_file(path);
      die(again.status(), "read_file");
      sections = again.value().sections();
    }
    uint64_t total = 0;
    for (const Section& sec : sections) total += sec.size;
    for (bool populate : {true, false}) {
      t0 = std::chrono::steady_clock::now();
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st;
      if (fd < 0 || ::fstat(fd, &st) != 0) die(Error(FOUNDRY_ERR_IO, "open failed"), "open");
      size_t size = static_cast<size_t>(st.st_size);
      void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
      ::close(fd);
      if (map == MAP_FAILED) die(Error(FOUNDRY_ERR_IO, "mmap failed"), "mmap");
      const uint8_t* base = static_cast<const uint8_t*>(map);
      std::vector<uint64_t> hashes(sections.size());
      parallel_for(sections.size(), work_threads(total / (4 << 20)),
                   [&](size_t i) { hashes[i] = hash64(base + sections[i].offset, sections[i].size); });
      row(populate ? "mmap(MAP_POPULATE) + XXH64 on threads" : "mmap (no populate) + XXH64 on threads")
          .push_back(ms_since(t0));
      ::munmap(map, size);
      sink ^= hashes[0];
    }
    if (sink == 42) std::printf(" ");
  }

  std::printf("\n%-44s %9s %9s   (%d repetitions, page cache warm)\n", "step", "median ms", "min ms", reps);
  for (Row& r : rows) {
    std::sort(r.ms.begin(), r.ms.end());
    std::printf("%-44s %9.2f %9.2f\n", r.name.c_str(), r.ms[r.ms.size() / 2], r.ms.front());
  }
  if (!keep) std::remove(path.c_str());
  return 0;
}
