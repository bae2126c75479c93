// Reader: CUgraph -> GraphModel, with the pointer audit. Kernel handles become (image, entry)
// through the registry, events become indices shared by all graphs read by one Reader, and every
// device address found in parameters or copies is classified against the region.
#pragma once

#include <cuda.h>

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "graph/model.h"

namespace foundry {

// A region allocation a graph references: LOAD must have it mapped before the graph runs.
struct RegionRef {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t kind = 0;  // BlockKind
};

struct ReadGraph {
  GraphModel model;
  std::vector<RegionRef> refs;  // sorted, unique
  uint32_t foreign_pointers = 0;  // words that point at device memory outside the region
  // Words that fall in region space nothing ever occupied: values (two 32-bit fields, say) that
  // look like region addresses; kept verbatim, as they cannot be pointers the kernel uses.
  uint32_t lookalike_words = 0;
  // Parameter words that point into region memory freed before SAVE (see word_class.h), kept
  // verbatim outside strict mode; the first one described, for the graph's summary line.
  uint32_t stale_words = 0;
  std::string first_stale_word;
};

class Reader {
 public:
  // `label` names the graph in error messages (e.g. "graph 3 (bs=8)").
  Result<ReadGraph> read(CUgraph graph, const std::string& label);
  uint32_t event_count() const { return static_cast<uint32_t>(events_.size()); }

 private:
  Status read_into(CUgraph graph, const std::string& label, int depth, GraphModel* out, ReadGraph* acc);
  Status read_kernel(CUgraphNode node, const std::string& where, KernelNode* k, ReadGraph* acc);
  // A kernel node an interposed NCCL launch added (c holds the launch).
  Status read_collective(CUgraphNode node, const std::string& where, CollectiveNode* c, ReadGraph* acc);
  // param_offset: the word's offset in the kernel's parameters, or -1 for a copy/memset address.
  Status audit(uint64_t value, const std::string& where, int64_t param_offset, ReadGraph* acc);
  Status stale_word(uint64_t value, const std::string& where, ReadGraph* acc);
  Status outside_word(uint64_t value, const std::string& where, bool is_param_word, ReadGraph* acc);
  uint32_t event_index(CUevent e);
  struct FunctionInfo {
    uint64_t image_hash = 0;
    std::string name;
    std::vector<ParamSlot> slots;
    FunctionAttrs attrs;
  };
  // Per function: what the driver says about it does not change during one SAVE, and the same
  // kernels appear in every graph, so each is asked once.
  Result<const FunctionInfo*> function_info(CUfunction func, CUkernel kern);

  std::map<CUevent, uint32_t> events_;
  std::map<void*, FunctionInfo> functions_;
};

}  // namespace foundry
