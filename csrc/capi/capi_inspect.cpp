// C boundary: reading archive files for people and tools (no driver calls). Strings returned
// through char** are malloc'd and released with foundry_free.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "archive/container.h"
#include "capi/errors.h"
#include "capi/foundry.h"
#include "common/json.h"
#include "graph/payload.h"
#include "graph/payload_json.h"
#include "modules/image_file.h"
#include "modules/image_format.h"

using namespace foundry;

namespace {

Status null_arg(const char* what) { return Error(FOUNDRY_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL"); }

// Nothing may escape into C: an allocation failure on a huge (or hostile) file becomes a status.
template <typename F>
foundry_status guarded(F&& body) {
  try {
    return report(body());
  } catch (const std::bad_alloc&) {
    return report(Error(FOUNDRY_ERR_IO, "out of memory"));
  } catch (...) {
    return report(Error(FOUNDRY_ERR_STATE, "unexpected internal error"));
  }
}

Status give_string(const std::string& s, char** out) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) return Error(FOUNDRY_ERR_IO, "out of memory");
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  *out = p;
  return Status::Ok();
}

const char* kind_name(uint32_t kind) {
  static const char* const kNames[] = {"unknown", "fatbin-wrapper", "fatbin", "cubin", "ptx"};
  return kind < sizeof kNames / sizeof kNames[0] ? kNames[kind] : "unknown";
}

std::string image_file_json(const ImageFileInfo& info) {
  using json::Value;
  char hash[20];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(info.hash));
  Value entries = Value::array();
  for (const std::string& e : info.entries) entries.push(Value::string(e));
  Value segments = Value::array();
  uint64_t stored = 0;
  for (uint64_t s : info.segment_sizes) {
    segments.push(Value::u64(s));
    stored += s;
  }
  Value v = Value::object();
  v.set("hash", Value::string(hash))
      .set("size", Value::u64(info.size))
      .set("kind", Value::u64(info.kind))
      .set("kind_name", Value::string(kind_name(info.kind)))
      .set("loader", Value::string(info.loader == 1 ? "library" : "module"))
      .set("wrapper_version", Value::u64(info.wrapper_version))
      .set("arch", Value::u64(info.arch))
      .set("nvshmem", Value::boolean(info.nvshmem != 0))
      .set("entries", std::move(entries))
      .set("segments", std::move(segments))
      .set("stored_size", Value::u64(stored));
  return json::dump(v, 1) + "\n";
}

// The loader identifies an image by its file name: a synthetic file under another name would be
// one LOAD refuses.
Status check_image_path(const std::string& path, uint64_t hash) {
  std::string want = image_file_name(hash);
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base != want) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, path + ": an image with this hash must be named " + want);
  return Status::Ok();
}

}  // namespace

extern "C" {

foundry_status foundry_payload_dump(const char* payload_path, char** json) {
  if (payload_path == nullptr || json == nullptr) return report(null_arg("payload_path or json"));
  return guarded([&]() -> Status {
    auto p = read_payload(payload_path);
    if (!p.ok()) return p.status();
    return give_string(payload_to_json(p.value()), json);
  });
}

foundry_status foundry_payload_from_json(const char* json, const char* payload_path) {
  if (json == nullptr || payload_path == nullptr) return report(null_arg("json or payload_path"));
  return guarded([&]() -> Status {
    auto p = payload_from_json(json);
    if (!p.ok()) return p.status();
    return write_payload(payload_path, p.value());
  });
}

foundry_status foundry_image_file_dump(const char* path, char** json) {
  if (path == nullptr || json == nullptr) return report(null_arg("path or json"));
  return guarded([&]() -> Status {
    auto info = read_image_file(path, /*copy_segments=*/false);
    if (!info.ok()) return info.status();
    return give_string(image_file_json(info.value()), json);
  });
}

foundry_status foundry_container_check(const char* path, uint32_t* sections) {
  if (path == nullptr) return report(null_arg("path"));
  return guarded([&]() -> Status {
    auto c = Container::read_file(path);
    if (!c.ok()) return c.status();
    if (sections) *sections = static_cast<uint32_t>(c.value().sections().size());
    return Status::Ok();
  });
}

foundry_status foundry_image_file_write_synthetic(const char* path, uint64_t hash, uint32_t loader,
                                                  const char* const* entries, uint32_t n_entries, const void* payload,
                                                  uint64_t size) {
  if (path == nullptr || (entries == nullptr && n_entries != 0) || payload == nullptr)
    return report(null_arg("path, entries or payload"));
  return guarded([&]() -> Status {
    if (loader > 1) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "loader must be 0 (module) or 1 (library)");
    if (size == 0 || size > kMaxImageBytes) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "image size out of range");
    FOUNDRY_RETURN_IF_ERROR(check_image_path(path, hash));
    ImageFileInfo info;
    info.hash = hash;
    info.size = size;
    // The first bytes alone: a wrapper's pointers are never followed here.
    info.kind = static_cast<uint32_t>(classify_image(payload, size));
    info.loader = loader;
    for (uint32_t i = 0; i < n_entries; ++i) {
      if (entries[i] == nullptr) return null_arg("an entry name");
      if (std::strlen(entries[i]) > kMaxImageEntryName) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "entry name too long");
      info.entries.emplace_back(entries[i]);
    }
    std::sort(info.entries.begin(), info.entries.end());  // as SAVE stores them
    const auto* bytes = static_cast<const uint8_t*>(payload);
    info.segments.emplace_back(bytes, bytes + size);
    info.segment_sizes.push_back(size);
    return write_image_file(path, info);
  });
}

void foundry_free(void* p) { std::free(p); }

}  // extern "C"
