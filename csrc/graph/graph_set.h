// LOAD: a set of restored graphs. Each topology template is built into a CUgraph once; every
// graph gets its own CUgraphExec, so a replay never synchronizes the device and never touches
// another graph's exec. A graph is instantiated from its template's CUgraph after the graph's
// delta has been written into that CUgraph's nodes (cuGraph*SetParams, which, unlike the exec
// updates, may also change which kernel a node runs); the CUgraph remembers which graph's values
// it holds, so going from one member to the next rewrites only the nodes either one changes.
//
// Instantiation: eager (all now, on the calling thread), parallel (N threads, each on its own
// clone of the templates), or lazy (on first launch, optionally ahead of it on a background
// thread). Before anything runs, every region block the graphs reference is mapped at its
// recorded address (or found already live with the same extent), and every NCCL launch the
// graphs recorded is made once under capture by the live NCCL (see LiveCollectives), and the
// graphs' NCCL serial events are the live NCCL's.
#pragma once

#include <cuda.h>

#include <atomic>
#include <map>
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
  // update_s: writing members' deltas into template CUgraphs (part of instantiation).
  double read_s = 0, claim_s = 0, build_s = 0, instantiate_s = 0, update_s = 0;
  uint64_t mapped_blocks = 0, existing_blocks = 0;
  uint64_t nccl_events = 0;  // archived events bound to the live NCCL's serial event
};

class GraphSet {
 public:
  // With DeltaRead::kLater, a graph's delta is read when the graph is first instantiated (lazy
  // LOAD pays only for the graphs it reaches); kNow reads and checks every one here, in parallel.
  static Result<std::unique_ptr<GraphSet>> open(const std::string& payload_path, DeltaRead deltas = DeltaRead::kNow);
  ~GraphSet();

  size_t count() const { return members_.size(); }
  size_t template_count() const { return payload_.templates.size(); }
  const PayloadMember& member(size_t i) const { return payload_.members[i]; }
  LoadTimes times() const;

  Status instantiate(size_t i);
  Status instantiate_all(int threads);
  void start_background();
  Status launch(size_t i, CUstream stream);
  bool ready(size_t i) const { return members_[i]->exec.load(std::memory_order_acquire) != nullptr; }
  // The CUgraph graph i is instantiated from, holding graph i's values (its template, built if it
  // was not yet, with i's delta written in). For inspection only: owned by the
  // set, and rewritten by the next instantiation of any graph of the same template (including a
  // background or lazy one), so read it while nothing else instantiates.
  Result<CUgraph> template_graph(size_t i);
  // The flags graph i's exec was instantiated with (graph/exec_flags.h), once it is instantiated.
  Result<uint64_t> exec_flags(size_t i) const;

 private:
  struct Member {
    std::mutex mu;  // serialises instantiation; launch() and ready() only read exec
    std::atomic<CUgraphExec> exec{nullptr};
  };
  // A template's CUgraph (or a worker's clone of it) and whose values its nodes hold.
  struct Working {
    CUgraph graph = nullptr;
    std::vector<CUgraphNode> nodes;
    static constexpr int64_t kUnknown = -2;  // a write failed part-way
    int64_t holds = -1;  // member index whose delta is written in; -1: the template's own values
  };
  // Built on first use: LOAD pays only for the templates of the graphs it instantiates.
  struct Template {
    std::mutex mu;  // the driver does not synchronise concurrent use of one CUgraph
    bool built = false;
    Working work;
  };

  Status prepare();
  Status prepare_collectives();
  // The archived events that were NCCL's serial event at SAVE become the live NCCL's
  // (collective/serial_events.h); the others stay events of this set's own.
  Status bind_nccl_events();
  // Reads member i's delta if it is still pending (caller holds members_[i]->mu).
  Status ensure_delta(size_t i);
  // Before member i goes into a CUgraph: its delta read and its kernels' attributes set (caller
  // holds members_[i]->mu).
  Status prepare_member(size_t i);
  // Every kernel the graphs name (those read so far) is an entry of a loaded image: a missing
  // one is reported at open, as before any graph is built.
  Status check_kernels_exist() const;
  // Sets the function attributes the nodes' kernels need before they go into a CUgraph: once per
  // kernel, and again only when a later graph needs more dynamic shared memory.
  Status require_function_attrs(const GraphModel& g);
  Status require_function_attrs(size_t member);  // what member's delta needs beyond its template
  Status require_function_attrs(const std::vector<const KernelNode*>& kernels);
  // Gives graph member i's NCCL kernel nodes their live parameters (before it is instantiated).
  Status apply_collectives(size_t i, const std::vector<CUgraphNode>& nodes);
  // Writes member i's values into w's nodes: i's delta, and the template's values back into the
  // nodes that the member w held changed and i does not.
  Status switch_to(size_t i, Working* w);
  // Writes the template's own values into every node of w (after a failed switch to member i).
  Status reset_to_template(size_t i, Working* w);
  // Writes node `index` of the graph being switched to (`member`, named in errors).
  Status set_node(const Node& n, CUgraphNode node, size_t index, size_t member);
  Status instantiate_from(size_t i, Working* w);
  Status clone_template(uint32_t t, Working* clone);
  Status ensure_built(uint32_t t);  // caller holds templates_[t]->mu

  std::string path_;
  Payload payload_;
  std::mutex attrs_mu_;
  std::map<std::pair<uint64_t, std::string>, int32_t> attrs_;  // kernel -> dynamic shared memory allowed
  std::unique_ptr<LiveCollectives> collectives_;  // only when some graph launches NCCL
  std::vector<CUevent> events_;
  std::vector<bool> own_events_;  // false: the live NCCL's event, not destroyed here
  std::vector<std::unique_ptr<Template>> templates_;
  std::vector<std::unique_ptr<Member>> members_;
  CUcontext ctx_ = nullptr;
  LoadTimes times_;
  std::atomic<int64_t> build_ns_{0};
  std::atomic<int64_t> update_ns_{0};
  std::atomic<int64_t> read_ns_{0};  // deltas read after open
  std::thread background_;
  std::atomic<bool> stop_{false};
};

}  // namespace foundry
