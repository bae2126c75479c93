// C boundary: a light look at a captured graph's kernels (used by diagnostics and tests before a
// full SAVE, e.g. to check every kernel maps to a known image).
#include <algorithm>
#include <vector>

#include "capi/errors.h"
#include "capi/foundry.h"
#include "driver/driver.h"

using namespace foundry;

extern "C" foundry_status foundry_graph_kernel_functions(uint64_t graph, uint64_t* out, uint64_t capacity,
                                                                     uint64_t* count) {
  auto drv = driver();
  if (!drv.ok()) return report(drv.status());
  const Driver* d = drv.value();
  CUgraph g = reinterpret_cast<CUgraph>(graph);
  size_t n = 0;
  Status s = cuda_check(d->cuGraphGetNodes(g, nullptr, &n), "cuGraphGetNodes");
  if (!s.ok()) return report(s);
  std::vector<CUgraphNode> nodes(n);
  s = cuda_check(d->cuGraphGetNodes(g, nodes.data(), &n), "cuGraphGetNodes");
  if (!s.ok()) return report(s);
  uint64_t found = 0;
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type;
    if (d->cuGraphNodeGetType(node, &type) != CUDA_SUCCESS || type != CU_GRAPH_NODE_TYPE_KERNEL) continue;
    CUDA_KERNEL_NODE_PARAMS p{};
    s = cuda_check(d->cuGraphKernelNodeGetParams(node, &p), "cuGraphKernelNodeGetParams");
    if (!s.ok()) return report(s);
    if (out && found < capacity) out[found] = reinterpret_cast<uint64_t>(p.func);
    ++found;
  }
  if (count) *count = found;
  return FOUNDRY_OK;
}

extern "C" foundry_status foundry_graph_edges(uint64_t graph, uint32_t* edges, uint64_t capacity, uint64_t* count) {
  auto drv = driver();
  if (!drv.ok()) return report(drv.status());
  const Driver* d = drv.value();
  CUgraph g = reinterpret_cast<CUgraph>(graph);
  size_t n = 0;
  Status s = cuda_check(d->cuGraphGetEdges(g, nullptr, nullptr, nullptr, &n), "cuGraphGetEdges");
  if (!s.ok()) return report(s);
  std::vector<CUgraphNode> from(n), to(n);
  std::vector<CUgraphEdgeData> data(n);
  if (n) s = cuda_check(d->cuGraphGetEdges(g, from.data(), to.data(), data.data(), &n), "cuGraphGetEdges");
  if (!s.ok()) return report(s);
  // Node indices follow cuGraphGetNodes order, as the graph reader numbers them.
  size_t nn = 0;
  d->cuGraphGetNodes(g, nullptr, &nn);
  std::vector<CUgraphNode> nodes(nn);
  if (nn) d->cuGraphGetNodes(g, nodes.data(), &nn);
  auto index = [&nodes](CUgraphNode x) { return static_cast<uint32_t>(std::find(nodes.begin(), nodes.end(), x) - nodes.begin()); };
  for (size_t i = 0; i < n && edges && i < capacity; ++i) {
    edges[2 * i] = index(from[i]) << 16 | index(to[i]);
    edges[2 * i + 1] = static_cast<uint32_t>(data[i].type) | static_cast<uint32_t>(data[i].from_port) << 8 |
                       static_cast<uint32_t>(data[i].to_port) << 16;
  }
  if (count) *count = n;
  return FOUNDRY_OK;
}
