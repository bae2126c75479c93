// LOAD: a set of restored graphs. Each topology template is built into a CUgraph once; every
// graph gets its own CUgraphExec, instantiated from its template and patched with its delta, so a
// replay never synchronizes the device and never touches another graph's exec.
//
// Instantiation: eager (all now, on the calling thread), parallel (N threads, each on its own
// clone of the templates), or lazy (on first launch, optionally ahead of it on a background
// thread). Before anything runs, every region block the graphs reference is mapped at its
// recorded address (or found already live with the same extent), and every NCCL launch the
// graphs recorded is made once under capture by the live NCCL (see LiveCollectives).
#pragma once

#include <cuda.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "collective/live_collectives.h"
#include "graph/payload.h"

namespace foundry {

struct LoadTimes {
  double read_s = 0, claim_s = 0, build_s = 0, instantiate_s = 0;
  uint64_t mapped_blocks = 0, existing_blocks = 0;
};

class GraphSet {
 public:
  static Result<std::unique_ptr<GraphSet>> open(const std::string& payload_path);
  ~GraphSet();

  size_t count() const { return members_.size(); }
  size_t template_count() const { return payload_.templates.size(); }
  const PayloadMember& member(size_t i) const { return payload_.members[i]; }
  LoadTimes times() const;

  Status instantiate(size_t i);
  Status instantiate_all(int threads);
  void start_background();
  Status launch(size_t i, CUstream stream);
  bool ready(size_t i) const { return members_[i]->exec != nullptr; }
  // The template graph i is instantiated from (built if it was not yet); nullptr on failure.
  CUgraph template_graph(size_t i);

 private:
  struct Member {
    std::mutex mu;
    CUgraphExec exec = nullptr;
  };
  // Built on first use: LOAD pays only for the templates of the graphs it instantiates.
  struct Template {
    std::mutex mu;  // the driver does not synchronise concurrent use of one CUgraph
    bool built = false;
    CUgraph graph = nullptr;
    std::vector<CUgraphNode> nodes;
  };

  Status prepare();
  Status prepare_collectives();
  // Gives graph member i's NCCL kernel nodes their live parameters (before it is instantiated).
  Status apply_collectives(size_t i, const std::vector<CUgraphNode>& nodes);
  Status instantiate_from(size_t i, CUgraph graph, const std::vector<CUgraphNode>& nodes);
  Status clone_template(uint32_t t, CUgraph* clone, std::vector<CUgraphNode>* nodes);
  Status ensure_built(uint32_t t);  // caller holds templates_[t]->mu

  Payload payload_;
  std::unique_ptr<LiveCollectives> collectives_;  // only when some graph launches NCCL
  std::vector<CUevent> events_;
  std::vector<std::unique_ptr<Template>> templates_;
  std::vector<std::unique_ptr<Member>> members_;
  CUcontext ctx_ = nullptr;
  LoadTimes times_;
  std::atomic<int64_t> build_ns_{0};
  std::thread background_;
  std::atomic<bool> stop_{false};
};

}  // namespace foundry
