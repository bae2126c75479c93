// C boundary: graph SAVE (Saver) and LOAD (GraphSet). Handles are opaque pointers owned by the
// caller, released with the matching _free function.
#include <cstring>
#include <memory>

#include "capi/errors.h"
#include "capi/foundry.h"
#include "graph/exec_warmup.h"
#include "graph/graph_set.h"
#include "graph/payload.h"
#include "graph/saver.h"

using namespace foundry;

namespace {
Status null_arg(const char* what) { return Error(FOUNDRY_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL"); }
}  // namespace

extern "C" {

foundry_status foundry_saver_new(void** out) {
  if (out == nullptr) return report(null_arg("out"));
  *out = new Saver();
  return FOUNDRY_OK;
}

foundry_status foundry_saver_add(void* saver, uint64_t graph, const char* name) {
  if (saver == nullptr || graph == 0) return report(null_arg("saver or graph"));
  return report(static_cast<Saver*>(saver)->add(reinterpret_cast<CUgraph>(graph), name ? name : ""));
}

foundry_status foundry_saver_write(void* saver, const char* payload_path, const char* images_root, int arch,
                                   foundry_save_stats* stats) {
  if (saver == nullptr || payload_path == nullptr || images_root == nullptr) return report(null_arg("saver or path"));
  auto r = static_cast<Saver*>(saver)->write(payload_path, images_root, arch);
  if (!r.ok()) return report(r.status());
  if (stats) {
    stats->graphs = r.value().graphs;
    stats->templates = r.value().templates;
    stats->nodes = r.value().nodes;
    stats->images = r.value().images;
  }
  return FOUNDRY_OK;
}

void foundry_saver_free(void* saver) { delete static_cast<Saver*>(saver); }

foundry_status foundry_payload_merge(const char* const* inputs, uint64_t count, const char* output, uint32_t* templates) {
  if ((inputs == nullptr && count) || output == nullptr) return report(null_arg("inputs or output"));
  std::vector<std::string> paths(inputs, inputs + count);
  return report(merge_payloads(paths, output, templates));
}

static foundry_status open_set(const char* payload_path, DeltaRead deltas, void** out) {
  if (payload_path == nullptr || out == nullptr) return report(null_arg("payload_path or out"));
  auto set = GraphSet::open(payload_path, deltas);
  if (!set.ok()) return report(set.status());
  *out = set.value().release();
  return FOUNDRY_OK;
}

foundry_status foundry_graphset_open(const char* payload_path, void** out) {
  return open_set(payload_path, DeltaRead::kNow, out);
}

foundry_status foundry_graphset_open_lazy(const char* payload_path, void** out) {
  return open_set(payload_path, DeltaRead::kLater, out);
}

foundry_status foundry_graphset_info(void* set, uint64_t* count, uint64_t* templates, foundry_load_times* times) {
  if (set == nullptr) return report(null_arg("set"));
  auto* s = static_cast<GraphSet*>(set);
  if (count) *count = s->count();
  if (templates) *templates = s->template_count();
  if (times) {
    const LoadTimes t = s->times();
    times->read_s = t.read_s, times->claim_s = t.claim_s, times->build_s = t.build_s;
    times->instantiate_s = t.instantiate_s, times->mapped_blocks = t.mapped_blocks, times->existing_blocks = t.existing_blocks;
    times->update_s = t.update_s;
    times->nccl_events = t.nccl_events;
  }
  return FOUNDRY_OK;
}

foundry_status foundry_graphset_name(void* set, uint64_t index, char* buf, size_t len) {
  auto* s = static_cast<GraphSet*>(set);
  if (s == nullptr || buf == nullptr || len == 0) return report(null_arg("set or buf"));
  if (index >= s->count()) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "graph index out of range"));
  std::strncpy(buf, s->member(index).name.c_str(), len - 1);
  buf[len - 1] = '\0';
  return FOUNDRY_OK;
}

foundry_status foundry_graphset_instantiate(void* set, uint64_t index) {
  if (set == nullptr) return report(null_arg("set"));
  return report(static_cast<GraphSet*>(set)->instantiate(index));
}

foundry_status foundry_graphset_instantiate_all(void* set, int threads) {
  if (set == nullptr) return report(null_arg("set"));
  return report(static_cast<GraphSet*>(set)->instantiate_all(threads));
}

foundry_status foundry_graphset_start_background(void* set) {
  if (set == nullptr) return report(null_arg("set"));
  static_cast<GraphSet*>(set)->start_background();
  return FOUNDRY_OK;
}

foundry_status foundry_graphset_ready(void* set, uint64_t index, int* ready) {
  auto* s = static_cast<GraphSet*>(set);
  if (s == nullptr || ready == nullptr) return report(null_arg("set or ready"));
  if (index >= s->count()) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "graph index out of range"));
  *ready = s->ready(index) ? 1 : 0;
  return FOUNDRY_OK;
}

foundry_status foundry_graphset_launch(void* set, uint64_t index, uint64_t stream) {
  if (set == nullptr) return report(null_arg("set"));
  return report(static_cast<GraphSet*>(set)->launch(index, reinterpret_cast<CUstream>(stream)));
}

foundry_status foundry_graphset_template(void* set, uint64_t index, uint64_t* graph) {
  auto* s = static_cast<GraphSet*>(set);
  if (s == nullptr || graph == nullptr) return report(null_arg("set or graph"));
  if (index >= s->count()) return report(Error(FOUNDRY_ERR_INVALID_ARGUMENT, "graph index out of range"));
  auto g = s->template_graph(index);
  if (!g.ok()) return report(g.status());
  *graph = reinterpret_cast<uint64_t>(g.value());
  return FOUNDRY_OK;
}

foundry_status foundry_graphset_exec_flags(void* set, uint64_t index, uint64_t* flags) {
  auto* s = static_cast<GraphSet*>(set);
  if (s == nullptr || flags == nullptr) return report(null_arg("set or flags"));
  auto f = s->exec_flags(index);
  if (!f.ok()) return report(f.status());
  *flags = f.value();
  return FOUNDRY_OK;
}

void foundry_graphset_free(void* set) { delete static_cast<GraphSet*>(set); }

foundry_status foundry_exec_memory_warm(const char* payload_path, const int* stop, foundry_exec_warmup* out) {
  if (payload_path == nullptr) return report(null_arg("payload_path"));
  auto sizes = payload_graph_sizes(payload_path);
  if (!sizes.ok()) return report(sizes.status());
  auto warm = warm_exec_memory(std::move(sizes.value()), stop);
  if (!warm.ok()) return report(warm.status());
  if (out) *out = foundry_exec_warmup{warm.value().graphs, warm.value().execs, warm.value().nodes, warm.value().seconds};
  return FOUNDRY_OK;
}

}  // extern "C"
