#include "graph/saver.h"

#include <set>

#include "archive/bytes.h"
#include "common/log.h"
#include "graph/payload.h"
#include "graph/serialize.h"
#include "graph/topology.h"
#include "modules/registry.h"
#include "region/region.h"

namespace foundry {

Status Saver::add(CUgraph graph, const std::string& name) {
  auto read = reader_.read(graph, "graph " + std::to_string(graphs_.size()) + " (" + name + ")");
  if (!read.ok()) return read.status();
  graphs_.push_back(std::move(read.value()));
  names_.push_back(name);
  return Status::Ok();
}

static void collect_images(const GraphModel& g, std::set<uint64_t>* out) {
  for (const Node& n : g.nodes) {
    if (n.kind == NodeKind::kKernel) out->insert(n.kernel.image_hash);
  }
  for (const GraphModel& c : g.children) collect_images(c, out);
}

// One line per graph for the words kept verbatim although they look like region addresses.
// Stale words (into freed memory) are rare and worth seeing; look-alikes are common (cuBLAS).
static void log_value_words(size_t i, const std::string& name, const ReadGraph& g) {
  if (g.stale_words) {
    LOG_INFO("graph %zu (%s): %u parameter words point into freed region memory and %u at region space nothing "
             "occupied; kept verbatim as values (FOUNDRY_STRICT=1 refuses the former). First: %s",
             i, name.c_str(), g.stale_words, g.lookalike_words, g.first_stale_word.c_str());
  } else if (g.lookalike_words) {
    LOG_DEBUG("graph %zu (%s): %u parameter words look like region addresses but point at space nothing ever "
              "occupied; kept as values", i, name.c_str(), g.lookalike_words);
  }
}

Result<SaveStats> Saver::write(const std::string& payload_path, const std::string& images_root, int arch) {
  if (graphs_.empty()) return Error(FOUNDRY_ERR_STATE, "no graphs to save");
  std::vector<const GraphModel*> models;
  for (const ReadGraph& g : graphs_) models.push_back(&g.model);
  Grouping grouping = group_graphs(models);

  Payload p;
  RegionInfo region = Region::instance().info();
  p.region_base = region.set ? region.base : 0;
  p.region_size = region.set ? region.size : 0;
  p.event_count = reader_.event_count();
  std::vector<uint32_t> template_slot(graphs_.size(), 0);
  for (uint32_t t = 0; t < grouping.templates.size(); ++t) {
    template_slot[grouping.templates[t]] = t;
    p.templates.push_back(graphs_[grouping.templates[t]].model);
  }
  SaveStats stats;
  std::set<uint64_t> images;
  for (size_t i = 0; i < graphs_.size(); ++i) {
    uint32_t t = template_slot[grouping.template_of[i]];
    PayloadMember m;
    m.name = names_[i];
    m.template_index = t;
    m.delta = make_delta(p.templates[t], graphs_[i].model);
    m.refs = graphs_[i].refs;
    // A member must come back exactly from template + encoded delta, or grouping or encoding is wrong.
    ByteWriter encoded;
    write_delta(encoded, p.templates[t], m.delta);
    ByteReader decoder(encoded.bytes().data(), encoded.size());
    std::vector<NodeDelta> decoded;
    GraphModel rebuilt;
    Status s = read_delta(decoder, p.templates[t], &decoded);
    if (s.ok()) s = apply_delta(p.templates[t], decoded, &rebuilt);
    if (!s.ok() || !models_equal(rebuilt, graphs_[i].model)) {
      return Error(FOUNDRY_ERR_STATE, "graph " + std::to_string(i) + " (" + names_[i] +
                                          ") cannot be reproduced from its topology template: grouping error");
    }
    log_value_words(i, names_[i], graphs_[i]);
    stats.nodes += graphs_[i].model.nodes.size();
    collect_images(graphs_[i].model, &images);
    p.members.push_back(std::move(m));
  }
  FOUNDRY_RETURN_IF_ERROR(write_payload(payload_path, p));
  FOUNDRY_RETURN_IF_ERROR(Registry::instance().pack(images_root, std::vector<uint64_t>(images.begin(), images.end()), arch));
  stats.graphs = static_cast<uint32_t>(graphs_.size());
  stats.templates = static_cast<uint32_t>(p.templates.size());
  stats.images = static_cast<uint32_t>(images.size());
  return stats;
}

}  // namespace foundry
