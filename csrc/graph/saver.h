// SAVE: reads captured graphs (with the pointer audit), groups them by topology, verifies that
// every member is reproducible from its template and delta, and writes the graph payload and the
// kernel images the graphs use.
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "graph/reader.h"

namespace foundry {

struct SaveStats {
  uint32_t graphs = 0;
  uint32_t templates = 0;
  uint64_t nodes = 0;
  uint32_t images = 0;
};

class Saver {
 public:
  Status add(CUgraph graph, const std::string& name);
  // Writes the payload file and the images the graphs use into <images_root>/images/.
  // arch: compute capability whose cubins are extracted from fatbins (0 keeps fatbins whole).
  Result<SaveStats> write(const std::string& payload_path, const std::string& images_root, int arch);
  size_t count() const { return graphs_.size(); }

 private:
  Reader reader_;
  std::vector<ReadGraph> graphs_;
  std::vector<std::string> names_;
};

}  // namespace foundry
