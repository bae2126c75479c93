#include "graph/model.h"

namespace foundry {

const char* node_kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::kKernel: return "kernel";
    case NodeKind::kMemset: return "memset";
    case NodeKind::kMemcpy: return "memcpy";
    case NodeKind::kEventRecord: return "event_record";
    case NodeKind::kEventWait: return "event_wait";
    case NodeKind::kEmpty: return "empty";
    case NodeKind::kChildGraph: return "child_graph";
    case NodeKind::kCollective: return "collective";
  }
  return "unknown";
}

}  // namespace foundry
