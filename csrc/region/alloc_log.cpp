#include "region/alloc_log.h"

#include <cinttypes>
#include <cstdio>

namespace foundry {

const char* log_kind_name(uint32_t kind) {
  static const char* names[] = {"alloc", "free", "reserve", "unreserve", "outside", "seal", "prealloc", "claim"};
  return kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

bool AllocLog::append(LogKind kind, uint64_t offset, uint64_t size) {
  foundry_log_entry e{entries_.size(), offset, size, static_cast<uint32_t>(kind), current_tag_};
  entries_.push_back(e);
  if (!expecting_ || diverged_) return !diverged_ || !expecting_;
  bool same = e.seq < expected_.size() && expected_[e.seq].kind == e.kind && expected_[e.seq].offset == e.offset &&
              expected_[e.seq].size == e.size;
  if (same) return true;
  diverged_ = true;
  div_actual_ = e;
  if (e.seq < expected_.size()) {
    div_expected_ = expected_[e.seq];
  } else {
    div_expected_ = foundry_log_entry{e.seq, 0, 0, UINT32_MAX, 0};  // past the end of the expectation
  }
  return false;
}

void AllocLog::reset() {
  entries_.clear();
  expecting_ = false;
  diverged_ = false;
  expected_.clear();
}

uint32_t AllocLog::set_tag(const std::string& tag) {
  for (uint32_t i = 0; i < tags_.size(); ++i) {
    if (tags_[i] == tag) return current_tag_ = i;
  }
  tags_.push_back(tag);
  return current_tag_ = static_cast<uint32_t>(tags_.size() - 1);
}

std::string AllocLog::tag(uint32_t index) const { return index < tags_.size() ? tags_[index] : std::string(); }

void AllocLog::expect(std::vector<foundry_log_entry> expected) {
  expected_ = std::move(expected);
  expecting_ = true;
  diverged_ = false;
  // Events already logged count too: compare them now.
  for (const foundry_log_entry& e : entries_) {
    bool same = e.seq < expected_.size() && expected_[e.seq].kind == e.kind &&
                expected_[e.seq].offset == e.offset && expected_[e.seq].size == e.size;
    if (!same) {
      diverged_ = true;
      div_actual_ = e;
      div_expected_ = e.seq < expected_.size() ? expected_[e.seq] : foundry_log_entry{e.seq, 0, 0, UINT32_MAX, 0};
      break;
    }
  }
}

std::string AllocLog::describe_divergence() const {
  if (!diverged_) return "no divergence";
  char buf[512];
  if (div_expected_.kind == UINT32_MAX) {
    std::snprintf(buf, sizeof(buf),
                  "allocation sequence diverged at seq %" PRIu64 ": expected no more events, got %s of %" PRIu64
                  " bytes at offset 0x%" PRIx64 " (tag '%s')",
                  div_actual_.seq, log_kind_name(div_actual_.kind), div_actual_.size, div_actual_.offset,
                  tag(div_actual_.tag).c_str());
  } else {
    std::snprintf(buf, sizeof(buf),
                  "allocation sequence diverged at seq %" PRIu64 ": expected %s of %" PRIu64
                  " bytes at offset 0x%" PRIx64 ", got %s of %" PRIu64 " bytes at offset 0x%" PRIx64 " (tag '%s')",
                  div_actual_.seq, log_kind_name(div_expected_.kind), div_expected_.size, div_expected_.offset,
                  log_kind_name(div_actual_.kind), div_actual_.size, div_actual_.offset, tag(div_actual_.tag).c_str());
  }
  return buf;
}

bool AllocLog::ever_covered(uint64_t offset) const {
  for (const foundry_log_entry& e : entries_) {
    bool covers_space = e.kind == static_cast<uint32_t>(LogKind::kAlloc) || e.kind == static_cast<uint32_t>(LogKind::kReserve) ||
                        e.kind == static_cast<uint32_t>(LogKind::kPrealloc) || e.kind == static_cast<uint32_t>(LogKind::kClaim);
    if (covers_space && offset >= e.offset && offset < e.offset + e.size) return true;
  }
  return false;
}

std::string AllocLog::describe_offset(uint64_t offset) const {
  // The newest event covering the offset, then the first free of that block after it.
  for (size_t i = entries_.size(); i-- > 0;) {
    const foundry_log_entry& e = entries_[i];
    if (e.kind == static_cast<uint32_t>(LogKind::kFree) || offset < e.offset || offset >= e.offset + e.size) continue;
    char buf[384];
    std::snprintf(buf, sizeof(buf), "%s at seq %" PRIu64 " (offset 0x%" PRIx64 ", %" PRIu64 " bytes, tag '%s')",
                  log_kind_name(e.kind), e.seq, e.offset, e.size, tag(e.tag).c_str());
    std::string out = buf;
    for (size_t j = i + 1; j < entries_.size(); ++j) {
      const foundry_log_entry& f = entries_[j];
      if (f.kind == static_cast<uint32_t>(LogKind::kFree) && f.offset == e.offset) {
        std::snprintf(buf, sizeof(buf), ", freed at seq %" PRIu64 " (tag '%s')", f.seq, tag(f.tag).c_str());
        out += buf;
        break;
      }
    }
    return out;
  }
  return "no region event ever covered it";
}

}  // namespace foundry
