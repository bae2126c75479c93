#include "graph/payload.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <thread>

#include "archive/bytes.h"
#include "archive/container.h"
#include "common/log.h"
#include "common/parallel.h"
#include "graph/serialize.h"

namespace foundry {
namespace {

constexpr uint32_t kSectionHeader = 1;
constexpr uint32_t kSectionTemplate = 2;
constexpr uint32_t kSectionMember = 3;
constexpr uint32_t kSectionNames = 4;
constexpr uint32_t kSectionCacheConfigs = 5;  // optional, see payload.h
constexpr size_t kMaxName = 4096;
constexpr uint32_t kMaxGraphs = 1 << 20;
// Sections are decoded on several threads when there are many of them or many bytes in them: a
// template of a few thousand nodes takes milliseconds, so 27 of them are worth spreading out.
constexpr size_t kSectionsPerThread = 16;
constexpr uint64_t kBytesPerThread = 256 << 10;

// Runs parse(i) for every section i, on several threads when there is enough to share (sections
// are independent); the error of the lowest index wins, as a serial parse would report it.
Status for_each_section(const std::vector<const Section*>& sections, const std::function<Status(size_t)>& parse) {
  const size_t n = sections.size();
  uint64_t bytes = 0;
  for (const Section* s : sections) bytes += s->size;
  size_t threads = work_threads(std::max<uint64_t>(n / kSectionsPerThread, bytes / kBytesPerThread));
  if (threads <= 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) FOUNDRY_RETURN_IF_ERROR(parse(i));
    return Status::Ok();
  }
  std::vector<Status> results(n);
  parallel_for(n, threads, [&](size_t i) { results[i] = parse(i); });
  for (const Status& st : results) FOUNDRY_RETURN_IF_ERROR(st);
  return Status::Ok();
}

// An event node past the payload's events would index out of bounds when the graph is built.
bool event_in_range(const Node& n, uint32_t event_count) {
  bool event = n.kind == NodeKind::kEventRecord || n.kind == NodeKind::kEventWait;
  return !event || n.event < event_count;
}

Status event_error(const std::string& where, const Node& n, uint32_t event_count) {
  return Error(FOUNDRY_ERR_FORMAT, where + ": an event node names event " + std::to_string(n.event) +
                                       ", but the payload has " + std::to_string(event_count) + " events");
}

// The first event node of g (children included) past the payload's events, or null.
const Node* event_out_of_range(const GraphModel& g, uint32_t event_count) {
  for (const Node& n : g.nodes) if (!event_in_range(n, event_count)) return &n;
  for (const GraphModel& c : g.children) if (const Node* bad = event_out_of_range(c, event_count)) return bad;
  return nullptr;
}

// ---- the kernel cache-config table ----

constexpr const char* kCacheTable = "kernel cache-config table";
constexpr size_t kCacheEntryBytes = 8 + 8 + 4;  // image hash, an empty name's length, CUfunc_cache

std::string kernel_label(uint64_t hash, const std::string& name) {
  char image[24];
  std::snprintf(image, sizeof image, "%016" PRIx64, hash);
  return "kernel " + name + " of image " + image;
}

std::vector<uint8_t> encode_cache_configs(const CacheConfigTable& table) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(table.size()));
  for (const auto& [kernel, config] : table) {
    w.u64(kernel.first);
    w.string(kernel.second);
    w.u32(static_cast<uint32_t>(config));
  }
  return w.take();
}

// The table, when the file has one (it is optional: older files and files whose kernels all
// keep the default have none). Anything malformed is refused, naming the table and the entry:
// a corrupt preference must not reach cuFuncSetCacheConfig.
Status read_cache_configs(const Container& c, const std::string& path, CacheConfigTable* out) {
  std::vector<const Section*> sections = c.find_all(kSectionCacheConfigs);
  if (sections.empty()) return Status::Ok();
  const std::string where = path + ": " + kCacheTable;
  if (sections.size() > 1)
    return Error(FOUNDRY_ERR_FORMAT, where + ": the file holds " + std::to_string(sections.size()) + " tables, one at most");
  ByteReader r(c.data(*sections[0]));
  uint32_t n = 0;
  if (!r.count32(&n, kCacheEntryBytes)) return Error(FOUNDRY_ERR_FORMAT, path + ": " + r.status(kCacheTable).message());
  CacheConfigTable table;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t hash = 0;
    std::string name;
    uint32_t config = 0;
    r.u64(&hash), r.string(&name, kMaxKernelNameBytes), r.u32(&config);
    std::string entry = std::string(kCacheTable) + " entry " + std::to_string(i);
    if (!r.ok()) return Error(FOUNDRY_ERR_FORMAT, path + ": " + r.status(entry.c_str()).message());
    entry = path + ": " + entry + " (" + kernel_label(hash, name) + ")";
    if (config > static_cast<uint32_t>(kCachePreferEqual))
      return Error(FOUNDRY_ERR_FORMAT, entry + ": cache config " + std::to_string(config) + " is not a CUfunc_cache value (0 to 3)");
    if (!table.emplace(std::make_pair(hash, std::move(name)), static_cast<int32_t>(config)).second)
      return Error(FOUNDRY_ERR_FORMAT, entry + ": a second entry for that kernel");
  }
  if (!r.at_end())
    return Error(FOUNDRY_ERR_FORMAT, where + ": " + std::to_string(r.remaining()) + " bytes after its " + std::to_string(n) + " entries");
  *out = std::move(table);
  return Status::Ok();
}

int32_t cache_config_of(const CacheConfigTable& table, const KernelNode& k) {
  if (table.empty()) return kCachePreferNone;  // the common case: no lookup, no key built
  auto it = table.find({k.image_hash, k.name});
  return it == table.end() ? kCachePreferNone : it->second;
}

// The node encoding has no cache preference: every kernel node of a template gets its kernel's.
void fill_cache_configs(const CacheConfigTable& table, GraphModel* g) {
  for (Node& n : g->nodes)
    if (n.kind == NodeKind::kKernel) n.kernel.func.cache_config = cache_config_of(table, n.kernel);
  for (GraphModel& c : g->children) fill_cache_configs(table, &c);
}

// A delta node starts as a copy of its template node, preference included: only a delta that
// runs another kernel needs its own.
void fill_cache_configs(const Payload& p, const GraphModel& tmpl, std::vector<NodeDelta>* delta) {
  for (NodeDelta& d : *delta) {
    if (d.value.kind != NodeKind::kKernel) continue;
    KernelNode& k = d.value.kernel;
    const KernelNode& base = tmpl.nodes[d.node].kernel;
    if (k.image_hash != base.image_hash || k.name != base.name) k.func.cache_config = cache_config_of(p.cache_configs, k);
  }
}

std::string graph_label(const std::string& path, size_t i, const std::string& name) {
  return path + ": graph " + std::to_string(i) + (name.empty() ? "" : " (" + name + ")");
}

Status read_refs(ByteReader& r, std::vector<RegionRef>* refs) {
  uint32_t n_refs = 0;
  r.count32(&n_refs, 20);
  for (uint32_t k = 0; k < n_refs && r.ok(); ++k) {
    RegionRef ref;
    r.u64(&ref.offset), r.u64(&ref.size), r.u32(&ref.kind);
    refs->push_back(ref);
  }
  return r.status("graph entry region references");
}

// Reads m's delta (m->delta is set only when all of it is valid).
Status read_member_delta(ByteReader& r, const Payload& p, size_t i, const std::string& path, PayloadMember* m) {
  std::vector<NodeDelta> delta;
  Status ds = read_delta(r, p.templates[m->template_index], &delta);
  if (!ds.ok()) return Error(ds.code(), graph_label(path, i, m->name) + ": " + ds.message());
  for (const NodeDelta& d : delta)
    if (!event_in_range(d.value, p.event_count)) return event_error(graph_label(path, i, m->name), d.value, p.event_count);
  fill_cache_configs(p, p.templates[m->template_index], &delta);
  m->delta = std::move(delta);
  return Status::Ok();
}

Status trailing_bytes(const ByteReader& r, const std::string& path, size_t i, const std::string& name) {
  if (r.at_end()) return Status::Ok();
  return Error(FOUNDRY_ERR_FORMAT, graph_label(path, i, name) + ": " + std::to_string(r.remaining()) +
                                       " bytes after the graph entry");
}

// Version 3: name, template, region blocks, delta (with `later`, left unread: copied to
// `copy_to` when there is one, else found again in the section at first use).
// Version 2: the delta before the blocks, so it is always read.
Status parse_member(ByteSpan bytes, const Payload& p, uint32_t version, bool later, uint8_t* copy_to,
                    const std::string& path, size_t i, PayloadMember* out) {
  ByteReader r(bytes);
  PayloadMember m;
  r.string(&m.name, kMaxName);
  r.u32(&m.template_index);
  Status entry = r.status("graph entry");
  if (!entry.ok()) return Error(entry.code(), graph_label(path, i, "") + ": " + entry.message());
  if (m.template_index >= p.templates.size()) {
    return Error(FOUNDRY_ERR_FORMAT, graph_label(path, i, "") + " names template " + std::to_string(m.template_index) +
                                         " of " + std::to_string(p.templates.size()));
  }
  if (version == 2) FOUNDRY_RETURN_IF_ERROR(read_member_delta(r, p, i, path, &m));
  Status refs = read_refs(r, &m.refs);
  if (!refs.ok()) return Error(refs.code(), graph_label(path, i, m.name) + ": " + refs.message());
  if (version != 2 && later) {
    m.pending_offset = copy_to ? static_cast<size_t>(copy_to - p.pending_bytes.data()) : r.offset();
    m.pending_size = r.remaining();
    ByteSpan rest;
    r.bytes(r.remaining(), &rest);
    if (copy_to && rest.size) std::memcpy(copy_to, rest.data, rest.size);
    m.delta_pending = true;
  } else if (version != 2) {
    FOUNDRY_RETURN_IF_ERROR(read_member_delta(r, p, i, path, &m));
    FOUNDRY_RETURN_IF_ERROR(trailing_bytes(r, path, i, m.name));
  }
  *out = std::move(m);
  return Status::Ok();
}

bool has_collectives(const GraphModel& g) {
  for (const Node& n : g.nodes) if (n.kind == NodeKind::kCollective) return true;
  for (const GraphModel& c : g.children) if (has_collectives(c)) return true;
  return false;
}

}  // namespace

Status write_payload(const std::string& path, const Payload& p) {
  ContainerWriter c;
  ByteWriter h;
  h.u32(kPayloadVersion);
  h.u32(static_cast<uint32_t>(p.members.size()));
  h.u32(static_cast<uint32_t>(p.templates.size()));
  h.u32(p.event_count);
  h.u64(p.region_base);
  h.u64(p.region_size);
  c.add(kSectionHeader, h.take());
  NameTable names;
  std::vector<std::vector<uint8_t>> templates;
  for (const GraphModel& t : p.templates) {
    ByteWriter w;
    write_graph(w, t, &names);
    templates.push_back(w.take());
  }
  ByteWriter nw;
  write_names(nw, names);
  c.add(kSectionNames, nw.take());
  // Only when some kernel has a preference: other files stay as older builds wrote them.
  CacheConfigTable cache_configs = cache_config_table(p);
  if (!cache_configs.empty()) c.add(kSectionCacheConfigs, encode_cache_configs(cache_configs));
  for (auto& t : templates) c.add(kSectionTemplate, std::move(t));
  for (const PayloadMember& m : p.members) {
    ByteWriter w;
    w.string(m.name);
    w.u32(m.template_index);
    w.u32(static_cast<uint32_t>(m.refs.size()));
    for (const RegionRef& r : m.refs) {
      w.u64(r.offset);
      w.u64(r.size);
      w.u32(r.kind);
    }
    write_delta(w, p.templates.at(m.template_index), m.delta);
    c.add(kSectionMember, w.take());
  }
  return write_container_file(path, c);
}

Result<Payload> read_payload(const std::string& path) {
  auto c = Container::read_file(path);
  if (!c.ok()) return c.status();
  return parse_payload(c.value(), path);
}

Result<Payload> parse_payload(const Container& c, const std::string& path, DeltaRead deltas) {
  // Other files share the container and its low section types (an image's metadata is type 1
  // too): tell them apart before reading a version out of someone else's section.
  if (c.find(kSectionNames) == nullptr) return Error(FOUNDRY_ERR_FORMAT, path + ": not a graph payload (no kernel name table)");
  auto hr = c.reader(kSectionHeader);
  if (!hr.ok()) return Error(FOUNDRY_ERR_FORMAT, path + ": no payload header");
  ByteReader& h = hr.value();
  Payload p;
  uint32_t version = 0, n_members = 0, n_templates = 0;
  h.u32(&version);
  if (h.ok() && (version < kOldestPayloadVersion || version > kPayloadVersion)) {
    return Error(FOUNDRY_ERR_VERSION, path + ": graph payload version " + std::to_string(version) + ", this build reads " +
                                          std::to_string(kOldestPayloadVersion) + " to " + std::to_string(kPayloadVersion));
  }
  h.u32(&n_members), h.u32(&n_templates), h.u32(&p.event_count), h.u64(&p.region_base), h.u64(&p.region_size);
  FOUNDRY_RETURN_IF_ERROR(h.status("graph payload header"));
  auto nr = c.reader(kSectionNames);
  if (!nr.ok()) return Error(FOUNDRY_ERR_FORMAT, path + ": no kernel name table");
  std::vector<std::string> names;
  Status names_status = read_names(nr.value(), &names);
  if (!names_status.ok()) return Error(names_status.code(), path + ": " + names_status.message());
  FOUNDRY_RETURN_IF_ERROR(read_cache_configs(c, path, &p.cache_configs));
  auto templates = c.find_all(kSectionTemplate);
  auto members = c.find_all(kSectionMember);
  if (templates.size() != n_templates || members.size() != n_members || n_members > kMaxGraphs) {
    return Error(FOUNDRY_ERR_FORMAT, path + ": the header announces " + std::to_string(n_templates) + " templates and " +
                                         std::to_string(n_members) + " graphs, the file holds " +
                                         std::to_string(templates.size()) + " and " + std::to_string(members.size()));
  }
  p.templates.resize(templates.size());
  FOUNDRY_RETURN_IF_ERROR(for_each_section(templates, [&](size_t t) -> Status {
    ByteReader r(c.data(*templates[t]));
    Status st = read_graph(r, &p.templates[t], 0, &names);
    if (!st.ok()) return Error(st.code(), path + ": template " + std::to_string(t) + ": " + st.message());
    fill_cache_configs(p.cache_configs, &p.templates[t]);
    return Status::Ok();
  }));
  for (size_t t = 0; t < p.templates.size(); ++t) {
    if (const Node* bad = event_out_of_range(p.templates[t], p.event_count))
      return event_error(path + ": template " + std::to_string(t), *bad, p.event_count);
  }
  // Every NCCL launch is made again at open, in archive order: such a payload is read whole.
  bool later = deltas == DeltaRead::kLater &&
               std::none_of(p.templates.begin(), p.templates.end(), [](const GraphModel& g) { return has_collectives(g); });
  later = later && version != 2;
  // Pending deltas of a file are read from it again at first use; those of a container parsed
  // from memory are copied out. A member's pending delta is at most its section: each gets that
  // much room, in file order.
  if (later && c.file()) p.pending_file = c.file();
  const bool copy = later && !p.pending_file;
  std::vector<size_t> room(members.size() + 1, 0);
  for (size_t i = 0; copy && i < members.size(); ++i) room[i + 1] = room[i] + members[i]->size;
  p.pending_bytes.resize(room.back());
  p.members.resize(members.size());
  FOUNDRY_RETURN_IF_ERROR(for_each_section(members, [&](size_t i) {
    uint8_t* copy_to = copy ? p.pending_bytes.data() + room[i] : nullptr;
    PayloadMember& m = p.members[i];
    FOUNDRY_RETURN_IF_ERROR(parse_member(c.data(*members[i]), p, version, later, copy_to, path, i, &m));
    m.section = *members[i];
    return Status::Ok();
  }));
  return p;
}

Status read_pending_delta(Payload* p, size_t i, const std::string& path) {
  PayloadMember& m = p->members.at(i);
  if (!m.delta_pending) return Status::Ok();
  const std::string where = path + " (read at first use)";
  std::vector<uint8_t, DefaultInitAllocator<uint8_t>> section;
  ByteReader r;
  if (!p->pending_file) {
    r = ByteReader(p->pending_bytes.data() + m.pending_offset, m.pending_size);
  } else {
    // The member's whole section, as it was when its checksum was checked at open, or refused.
    section.resize(static_cast<size_t>(m.section.size));
    Status again = read_section_again(*p->pending_file, m.section, graph_label(where, i, m.name), section.data());
    if (again.code() == FOUNDRY_ERR_MISMATCH) return Error(again.code(), again.message() + "; the graph is refused");
    FOUNDRY_RETURN_IF_ERROR(again);
    r = ByteReader(section.data() + m.pending_offset, m.pending_size);
  }
  FOUNDRY_RETURN_IF_ERROR(read_member_delta(r, *p, i, where, &m));
  FOUNDRY_RETURN_IF_ERROR(trailing_bytes(r, where, i, m.name));
  m.delta_pending = false;
  return Status::Ok();
}

CacheConfigTable cache_config_table(const Payload& p) {
  CacheConfigTable table;
  std::set<std::pair<uint64_t, std::string>> warned;
  for_each_node(p, [&](const Node& n) {
    if (n.kind != NodeKind::kKernel || n.kernel.func.cache_config == kCachePreferNone) return;
    const KernelNode& k = n.kernel;
    if (k.func.cache_config < kCachePreferNone || k.func.cache_config > kCachePreferEqual) {
      // Readers refuse such a table: the kernel keeps the driver's default instead.
      if (warned.insert({k.image_hash, k.name}).second)
        LOG_WARNING("%s: cache preference %d is not a CUfunc_cache value; the archive keeps none for it",
                    kernel_label(k.image_hash, k.name).c_str(), k.func.cache_config);
      return;
    }
    auto [it, fresh] = table.try_emplace({k.image_hash, k.name}, k.func.cache_config);
    if (fresh || it->second == k.func.cache_config || !warned.insert(it->first).second) return;
    LOG_WARNING("%s: the graphs were saved with cache preferences %d and %d; the archive keeps %d",
                kernel_label(k.image_hash, k.name).c_str(), it->second, k.func.cache_config, it->second);
  });
  return table;
}

void for_each_node(const Payload& p, const std::function<void(const Node&)>& visit) {
  std::function<void(const GraphModel&)> walk = [&](const GraphModel& g) {
    for (const Node& n : g.nodes) visit(n);
    for (const GraphModel& c : g.children) walk(c);
  };
  for (const GraphModel& t : p.templates) walk(t);
  for (const PayloadMember& m : p.members)
    for (const NodeDelta& d : m.delta) visit(d.value);
}


static void offset_events(GraphModel* g, uint32_t by) {
  for (Node& n : g->nodes) {
    if (n.kind == NodeKind::kEventRecord || n.kind == NodeKind::kEventWait) n.event += by;
  }
  for (GraphModel& c : g->children) offset_events(&c, by);
}

Status merge_payloads(const std::vector<std::string>& inputs, const std::string& output, uint32_t* templates) {
  std::vector<GraphModel> models;
  std::vector<PayloadMember> members;
  Payload out;
  for (const std::string& path : inputs) {
    auto p = read_payload(path);
    if (!p.ok()) return p.status();
    if (!models.empty() && (p.value().region_base != out.region_base || p.value().region_size != out.region_size)) {
      return Error(FOUNDRY_ERR_MISMATCH, path + " was saved with another allocation region than the other graphs");
    }
    out.region_base = p.value().region_base;
    out.region_size = p.value().region_size;
    for (PayloadMember& m : p.value().members) {
      GraphModel g;
      FOUNDRY_RETURN_IF_ERROR(apply_delta(p.value().templates[m.template_index], m.delta, &g));
      offset_events(&g, out.event_count);
      models.push_back(std::move(g));
      members.push_back(std::move(m));
    }
    out.event_count += p.value().event_count;
  }
  std::vector<const GraphModel*> ptrs;
  for (const GraphModel& g : models) ptrs.push_back(&g);
  Grouping grouping = group_graphs(ptrs);
  std::vector<uint32_t> slot(models.size(), 0);
  for (uint32_t t = 0; t < grouping.templates.size(); ++t) {
    slot[grouping.templates[t]] = t;
    out.templates.push_back(models[grouping.templates[t]]);
  }
  for (size_t i = 0; i < models.size(); ++i) {
    PayloadMember m = std::move(members[i]);
    m.template_index = slot[grouping.template_of[i]];
    m.delta = make_delta(out.templates[m.template_index], models[i]);
    out.members.push_back(std::move(m));
  }
  if (templates) *templates = static_cast<uint32_t>(out.templates.size());
  return write_payload(output, out);
}

}  // namespace foundry
