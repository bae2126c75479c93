// The exec-memory warm-up (graph/exec_warmup.h) against the fake driver (fake_driver/fake_cuda.cpp,
// found first on LD_LIBRARY_PATH, see CMakeLists.txt): one stand-in exec per archived graph, of that
// graph's node count, all alive at once and all released after, also when the driver fails part-way;
// and the graph sizes read from a payload file.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <cuda.h>

#include "common/load_settings.h"
#include "graph/exec_flags.h"
#include "graph/exec_warmup.h"
#include "graph/payload.h"
#include "tests/check.h"

using namespace foundry;

// The fake driver's controls.
extern "C" {
void fake_reset_graphs(long n);
size_t fake_exec_sizes(uint64_t* out, size_t cap);
size_t fake_most_live_execs();
unsigned long long fake_last_instantiate_flags();
long fake_live_graphs_and_execs();
long fake_live_modules();
}

namespace {

std::vector<uint64_t> exec_sizes() {
  std::vector<uint64_t> out(64);
  out.resize(fake_exec_sizes(out.data(), out.size()));
  return out;
}

void with_context() { cuCtxSetCurrent(reinterpret_cast<CUcontext>(0x7000)); }

Node kernel_node() {
  Node n;
  n.kind = NodeKind::kKernel;
  n.kernel.image_hash = 0xabc;
  n.kernel.name = "_Z1kv";
  n.kernel.params.assign(8, 0);
  n.kernel.slots = {{0, 8}};
  return n;
}

GraphModel chain(size_t nodes) {
  GraphModel g;
  for (size_t i = 0; i < nodes; ++i) g.nodes.push_back(kernel_node());
  for (uint32_t i = 1; i < nodes; ++i) g.edges.push_back(Edge{i - 1, i, 0, 0, 0});
  return g;
}

// A graph of `own` kernel nodes and one child graph node whose child has `child` nodes.
GraphModel with_child(size_t own, size_t child) {
  GraphModel g = chain(own);
  g.children.push_back(chain(child));
  Node c;
  c.kind = NodeKind::kChildGraph;
  c.child = 0;
  g.nodes.push_back(c);
  return g;
}

}  // namespace

TEST_CASE("child graphs count with their nodes, as the driver flattens them") {
  CHECK_EQ(flattened_nodes(chain(5)), 5u);
  CHECK_EQ(flattened_nodes(with_child(3, 4)), 7u);  // 3 + 4, the child node itself replaced
  GraphModel nested = with_child(2, 0);
  nested.children[0] = with_child(1, 6);
  CHECK_EQ(flattened_nodes(nested), 2u + 1u + 6u);
}

TEST_CASE("one stand-in exec per graph, of its size, all alive together, all released after") {
  with_context();
  long modules = fake_live_modules(), handles = fake_live_graphs_and_execs();
  fake_reset_graphs(-1);
  auto w = warm_exec_memory({300, 0, 100, 200, 100});
  CHECK(w.ok());
  if (w.ok()) {
    CHECK_EQ(w.value().execs, 4u);  // the empty graph needs no exec memory
    CHECK_EQ(w.value().nodes, 700u);
  }
  CHECK(exec_sizes() == (std::vector<uint64_t>{100, 100, 200, 300}));
  CHECK_EQ(fake_most_live_execs(), 4u);  // kept alive as a restore keeps its graphs
  CHECK_EQ(fake_live_graphs_and_execs(), handles);
  CHECK_EQ(fake_live_modules(), modules);  // the no-op kernel's module unloaded
}

TEST_CASE("execs are instantiated with PyTorch's flags; FOUNDRY_NODE_PRIORITY=0 leaves node priorities out") {
  with_context();
  fake_reset_graphs(-1);
  CHECK_EQ(exec_instantiate_flags(), 9ull);  // AUTO_FREE_ON_LAUNCH | USE_NODE_PRIORITY
  CHECK(warm_exec_memory({10}).ok());
  CHECK_EQ(fake_last_instantiate_flags(), 9ull);
  set_use_node_priority(false);
  CHECK(warm_exec_memory({10}).ok());
  CHECK_EQ(fake_last_instantiate_flags(), 1ull);
  set_use_node_priority(true);
}

TEST_CASE("a driver failure part-way is reported and releases what was made") {
  with_context();
  long modules = fake_live_modules(), handles = fake_live_graphs_and_execs();
  fake_reset_graphs(2);  // the third instantiation fails (out of memory)
  auto w = warm_exec_memory({10, 20, 30, 40});
  CHECK(!w.ok());
  if (!w.ok()) CHECK(w.status().message().find("cuGraphInstantiate (stand-in)") != std::string::npos);
  CHECK_EQ(exec_sizes().size(), 2u);
  CHECK_EQ(fake_live_graphs_and_execs(), handles);
  CHECK_EQ(fake_live_modules(), modules);
  fake_reset_graphs(-1);
}

TEST_CASE("a stop asked for ends the warm-up before the next stand-in") {
  with_context();
  long handles = fake_live_graphs_and_execs();
  fake_reset_graphs(-1);
  int stop = 1;
  auto w = warm_exec_memory({10, 20}, &stop);
  CHECK(w.ok());
  if (w.ok()) CHECK(w.value().graphs == 2u && w.value().execs == 0u && w.value().nodes == 0u);
  CHECK(exec_sizes().empty());
  CHECK_EQ(fake_live_graphs_and_execs(), handles);
  stop = 0;
  w = warm_exec_memory({10, 20}, &stop);
  CHECK(w.ok() && w.value().execs == 2u);
}

TEST_CASE("the sizes of a payload's graphs: each member its template's, children flattened") {
  Payload p;
  p.templates = {chain(3), with_child(2, 5)};
  for (uint32_t t : {1u, 0u, 1u}) {
    PayloadMember m;
    m.name = "g" + std::to_string(p.members.size());
    m.template_index = t;
    p.members.push_back(m);
  }
  std::string path = "/tmp/foundry-test-exec-warmup-" + std::to_string(::getpid()) + ".fgr";
  CHECK(write_payload(path, p).ok());
  auto sizes = payload_graph_sizes(path);
  CHECK(sizes.ok());
  if (sizes.ok()) CHECK(sizes.value() == (std::vector<uint64_t>{7, 3, 7}));
  std::remove(path.c_str());
  CHECK(!payload_graph_sizes(path).ok());  // a missing file is an error, not zero graphs
}

TEST_MAIN()
