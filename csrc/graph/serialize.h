// Compact binary encoding of a GraphModel. The encoding carries no version of its own: the
// archive container around it does. Reading validates everything a later stage would otherwise
// trust (kinds, indices, sizes), so a decoded model is structurally safe to build from; archives
// may be corrupt or hostile, and a read never crashes or allocates more than the input justifies.
//
// Layout (little-endian, see archive/bytes.h):
//   graph := u32 node_count, node*, u32 edge_count, edge*, u32 child_count, graph*
//   node  := u32 kind, then the fields of that kind (write_node); parameter and attribute bytes are
//            stored as runs of non-zero bytes (they are mostly zeros: unused dimensions, padding)
//   edge  := u32 from, u32 to, u8 from_port, u8 to_port, u8 type
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "archive/bytes.h"
#include "common/status.h"
#include "graph/model.h"
#include "graph/topology.h"

namespace foundry {

// Limits enforced on read. CUDA's own kernel parameter limit is 32 KiB; we allow twice that so a
// future driver raising it does not make old archives unreadable, while still refusing absurd sizes.
constexpr int kMaxGraphDepth = 8;              // child graph nesting levels below the top graph
constexpr size_t kMaxKernelNameBytes = 64 * 1024;
constexpr size_t kMaxKernelParamBytes = 64 * 1024;
constexpr size_t kMaxLaunchAttrBytes = 64;

// Kernel names are long and repeat across the graphs of an archive: with a table, each is stored
// once and nodes refer to it by index. Without one (nullptr), nodes carry the name itself.
class NameTable {
 public:
  uint32_t intern(const std::string& name);
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> index_;
};

void write_names(ByteWriter& w, const NameTable& t);
Status read_names(ByteReader& r, std::vector<std::string>* names);

void write_node(ByteWriter& w, const Node& n, NameTable* names = nullptr);
// Reads one node and validates what can be checked without its graph (kind, sizes, param slots,
// element size); the child index is checked by read_graph / apply_delta. `depth` is the nesting
// level of the graph the node belongs to (refused above kMaxGraphDepth, named in errors).
Status read_node(ByteReader& r, Node* n, int depth, const std::vector<std::string>* names = nullptr);

void write_graph(ByteWriter& w, const GraphModel& g, NameTable* names = nullptr);
// Reads a graph written by write_graph into *g (replaced only on success). `depth` is the nesting
// level of this graph: 0 for a top-level graph; child graphs deeper than kMaxGraphDepth are refused.
Status read_graph(ByteReader& r, GraphModel* g, int depth = 0, const std::vector<std::string>* names = nullptr);

// A member graph's delta, encoded against its template: per changed node only what is not
// topology (kernel: which kernel (image, name, parameter layout) when it is another than the
// template's, grid, block, shared memory, dynamic shared memory limit, carveout, and the
// parameter bytes as runs that differ from the template's; memset/memcpy: their fields; events:
// the index). Reading copies the template node and applies the change, validating the node index.
void write_delta(ByteWriter& w, const GraphModel& tmpl, const std::vector<NodeDelta>& d);
Status read_delta(ByteReader& r, const GraphModel& tmpl, std::vector<NodeDelta>* d);

}  // namespace foundry
