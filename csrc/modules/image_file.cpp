#include "modules/image_file.h"

#include <cinttypes>
#include <cstdio>
#include <utility>

#include "archive/bytes.h"
#include "archive/container.h"

namespace foundry {
namespace {

// Each entry name is a u64 length at least, so a hostile count is bounded by the section size.
constexpr size_t kMinEntryBytes = 8;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Status read_meta(ByteReader& m, const std::string& path, ImageFileInfo* info) {
  uint32_t version = 0, n_entries = 0;
  m.u32(&version);
  if (m.ok() && version != kImageMetaVersion) {
    return Error(FOUNDRY_ERR_VERSION, path + ": image metadata version " + std::to_string(version) + ", this build reads " +
                                          std::to_string(kImageMetaVersion));
  }
  m.u64(&info->hash), m.u64(&info->size), m.u32(&info->kind), m.u32(&info->loader), m.u32(&info->wrapper_version);
  m.u32(&info->arch), m.u32(&info->nvshmem);
  m.count32(&n_entries, kMinEntryBytes);
  for (uint32_t i = 0; i < n_entries && m.ok(); ++i) {
    std::string e;
    if (m.string(&e, kMaxImageEntryName)) info->entries.push_back(std::move(e));
  }
  Status st = m.status("image metadata");
  return st.ok() ? st : Error(st.code(), path + ": " + st.message());
}

}  // namespace

std::string image_file_name(uint64_t hash) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64 "%s", hash, kImageFileSuffix);
  return buf;
}

bool image_file_hash(const std::string& path, uint64_t* hash) {
  const std::string name = path.substr(path.find_last_of('/') + 1);
  const std::string suffix = kImageFileSuffix;
  if (name.size() != 16 + suffix.size() || name.compare(16, std::string::npos, suffix) != 0) return false;
  uint64_t value = 0;
  for (size_t i = 0; i < 16; ++i) {
    const char c = name[i];
    if (c >= '0' && c <= '9') value = value << 4 | static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') value = value << 4 | static_cast<uint64_t>(c - 'a' + 10);
    else return false;
  }
  *hash = value;
  return true;
}

Result<ImageFileInfo> read_image_file(const std::string& path, bool copy_segments) {
  auto c = Container::read_file(path);
  if (!c.ok()) return c.status();
  // A graph payload is a container too, with a type-1 section of its own: refuse it by its types.
  for (const Section& s : c.value().sections()) {
    if (s.type != kImageSectionMeta && s.type != kImageSectionSegment)
      return Error(FOUNDRY_ERR_FORMAT, path + ": not a kernel image file (it holds a section of type " + std::to_string(s.type) + ")");
  }
  auto rd = c.value().reader(kImageSectionMeta);
  if (!rd.ok()) return Error(FOUNDRY_ERR_FORMAT, path + ": no image metadata section");
  ImageFileInfo info;
  FOUNDRY_RETURN_IF_ERROR(read_meta(rd.value(), path, &info));
  if (info.loader > 1) return Error(FOUNDRY_ERR_FORMAT, path + ": unknown loader " + std::to_string(info.loader));
  // The hash is the image's identity at LOAD; a file renamed to another hash would make a kernel
  // resolve into the wrong image.
  if (!ends_with(path, image_file_name(info.hash))) {
    char hex[20];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, info.hash);
    return Error(FOUNDRY_ERR_FORMAT, path + ": file name does not match the image hash " + hex);
  }
  for (const Section* s : c.value().find_all(kImageSectionSegment)) {
    ByteSpan span = c.value().data(*s);
    info.segment_sizes.push_back(span.size);
    if (copy_segments) info.segments.push_back(span.to_vector());
  }
  if (info.segment_sizes.empty()) return Error(FOUNDRY_ERR_FORMAT, path + ": image has no payload");
  return Result<ImageFileInfo>(std::move(info));  // explicit: the segments may be large
}

Status write_image_file(const std::string& path, const ImageFileInfo& info) {
  ByteWriter meta;
  meta.u32(kImageMetaVersion);
  meta.u64(info.hash);
  meta.u64(info.size);
  meta.u32(info.kind);
  meta.u32(info.loader);
  meta.u32(info.wrapper_version);
  meta.u32(info.arch);
  meta.u32(info.nvshmem);
  meta.u32(static_cast<uint32_t>(info.entries.size()));
  for (const std::string& e : info.entries) meta.string(e);
  ContainerWriter w;
  w.add(kImageSectionMeta, meta.take());
  for (const auto& s : info.segments) w.add(kImageSectionSegment, s);
  return write_container_file(path, w);
}

}  // namespace foundry
