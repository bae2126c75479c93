#include "collective/collective_log.h"

namespace foundry {

CollectiveLog& CollectiveLog::instance() {
  static CollectiveLog* log = new CollectiveLog();  // never destroyed: handlers may run during exit
  return *log;
}

void CollectiveLog::add_comm(void* comm) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.push_back(comm);
}

void CollectiveLog::remove_comm(void* comm) {
  std::lock_guard<std::mutex> lock(mu_);
  for (void*& c : comms_)
    if (c == comm) c = nullptr;
}

uint32_t CollectiveLog::ordinal(void* comm) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = comms_.size(); i-- > 0;)
    if (comm != nullptr && comms_[i] == comm) return static_cast<uint32_t>(i);
  return kUnknownComm;
}

void* CollectiveLog::comm(uint32_t ordinal) {
  std::lock_guard<std::mutex> lock(mu_);
  return ordinal < comms_.size() ? comms_[ordinal] : nullptr;
}

uint32_t CollectiveLog::comm_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(comms_.size());
}

void CollectiveLog::record(CUgraph graph, const std::vector<CUgraphNode>& kernels, std::vector<CollectiveCall> calls) {
  auto shared = std::make_shared<const std::vector<CollectiveCall>>(std::move(calls));
  std::lock_guard<std::mutex> lock(mu_);
  ++launches_;
  for (size_t i = 0; i < kernels.size(); ++i) nodes_[{graph, kernels[i]}] = Entry{static_cast<uint32_t>(i), shared};
}

bool CollectiveLog::find(CUgraph graph, CUgraphNode node, CollectiveNode* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find({graph, node});
  if (it == nodes_.end()) return false;
  out->kernel = it->second.kernel;
  out->calls = *it->second.calls;
  return true;
}

uint64_t CollectiveLog::launches_recorded() {
  std::lock_guard<std::mutex> lock(mu_);
  return launches_;
}

}  // namespace foundry
