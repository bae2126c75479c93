// The graph payload file (graphs.fgr): one section container holding the templates whole and
// every graph as (template index, per-node delta, region blocks it needs).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "archive/container.h"
#include "common/status.h"
#include "graph/model.h"
#include "graph/reader.h"
#include "graph/topology.h"

namespace foundry {

// 2: kernel deltas may name another kernel. 3: a graph's region blocks come before its delta, so
// that a reader can take every graph's blocks and leave the deltas for later. Versions 2 and 3
// are read; 3 is written.
//
// Optional sections need no version: the reader looks sections up by type and passes over types
// it does not know. The kernel cache-config table (one section, only when some kernel has a
// preference other than CU_FUNC_CACHE_PREFER_NONE) lists
//   u32 count, then per kernel: u64 image hash, string entry name, u32 CUfunc_cache
// sorted by (hash, name). A file without it (older builds, or no such kernel) reads as
// PREFER_NONE everywhere; an older build reading a newer file ignores it and restores the kernels
// with the driver's default preference, as it always did.
constexpr uint32_t kPayloadVersion = 3;
constexpr uint32_t kOldestPayloadVersion = 2;

// (image hash, entry name) -> CUfunc_cache, for kernels whose preference is not PREFER_NONE.
using CacheConfigTable = std::map<std::pair<uint64_t, std::string>, int32_t>;

struct PayloadMember {
  std::string name;
  uint32_t template_index = 0;  // into Payload::templates
  std::vector<NodeDelta> delta;
  std::vector<RegionRef> refs;
  // Left by parse_payload(DeltaRead::kLater): the delta's encoded bytes, pending_size bytes at
  // pending_offset of Payload::pending_bytes or, when Payload::pending_file is set, of this
  // member's container section, which read_pending_delta reads again from the file and checks
  // against the checksum it matched at open (read_section_again).
  bool delta_pending = false;
  size_t pending_offset = 0, pending_size = 0;
  Section section;
};

// An allocator whose resize() leaves new elements default-initialised (for bytes: not written),
// where std::allocator value-initialises (zeroes) them: for buffers about to be overwritten whole.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

struct Payload {
  uint64_t region_base = 0;
  uint64_t region_size = 0;
  uint32_t event_count = 0;
  std::vector<GraphModel> templates;
  std::vector<PayloadMember> members;
  // Where the deltas parse_payload(kLater) left unread are. From a container read from a file
  // (Container::read_file): nothing is copied at open; each is read again from the file, held
  // open here, at first use and refused unless it has the checksum the file had at open (a file
  // changed or truncated in place since cannot change or fault what is read; one replaced by
  // rename is still read through this descriptor). From a container parsed from memory: copied
  // out into pending_bytes once its checksums were checked, not zeroed first (each member's delta
  // is copied in whole, and only those bytes are ever read).
  std::shared_ptr<const OpenFile> pending_file;
  std::vector<uint8_t, DefaultInitAllocator<uint8_t>> pending_bytes;
  // The cache-config table as read; the reader has set every kernel node's func.cache_config from
  // it, and a delta read later takes its kernels' values from here. write_payload writes the table
  // from the nodes, not from this field.
  CacheConfigTable cache_configs;
};

// The table write_payload stores for p: every kernel of the templates (child graphs included) and
// of the members' deltas whose func.cache_config is not PREFER_NONE. Nodes of one kernel agree when
// they come from one SAVE; where they do not (payloads of several processes merged), the first
// preference other than PREFER_NONE in payload order is kept (with a warning when two differ).
CacheConfigTable cache_config_table(const Payload& p);

// Every node a payload holds: templates (child graphs included), then members' deltas (those
// read; a pending delta is not visited).
void for_each_node(const Payload& p, const std::function<void(const Node&)>& visit);

// When parse_payload reads the graphs' deltas: all now, or each when read_pending_delta asks for
// it (LOAD then pays only for the graphs it instantiates). A version 2 payload, or one whose
// templates hold NCCL nodes (every collective is made again at open, in archive order), is read
// whole either way.
enum class DeltaRead { kNow, kLater };

Status write_payload(const std::string& path, const Payload& p);
Result<Payload> read_payload(const std::string& path);
// The same from a container already read and checked; `path` names it in errors.
Result<Payload> parse_payload(const Container& c, const std::string& path, DeltaRead deltas = DeltaRead::kNow);
// Reads member i's pending delta (no-op when it was read); errors name `path` and the graph.
Status read_pending_delta(Payload* p, size_t i, const std::string& path);
// Reads several payloads and writes one whose graphs are regrouped across all of them (so graphs
// saved one at a time share templates). Event indices are kept apart per input payload.
Status merge_payloads(const std::vector<std::string>& inputs, const std::string& output, uint32_t* templates);

}  // namespace foundry
