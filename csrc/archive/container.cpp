#include "archive/container.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "archive/atomic_dir.h"
#include "common/hash.h"
#include "common/parallel.h"

namespace foundry {

namespace {

constexpr uint8_t kMagic[8] = {'F', 'D', 'R', 'Y', 'C', 'N', 'T', '1'};
// The header checksum covers magic, version, count, file_size and table_checksum.
constexpr size_t kHeaderChecksummed = 32;
constexpr size_t kHeaderReservedStart = 40;

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t align8(uint64_t v) { return (v + 7) & ~uint64_t{7}; }

Status format_error(const std::string& name, const std::string& where, const std::string& cause) {
  return Error(FOUNDRY_ERR_FORMAT, name + ": " + where + ": " + cause);
}

Status checksum_error(const std::string& name, const std::string& where, uint64_t stored, uint64_t computed) {
  return Error(FOUNDRY_ERR_MISMATCH, name + ": " + where + ": checksum mismatch (stored " + hex(stored) +
                                         ", computed " + hex(computed) + "); the file is corrupt");
}

std::string section_label(size_t index, const Section& s) {
  return "section " + std::to_string(index) + " (type " + std::to_string(s.type) + ")";
}

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

struct Header {
  uint32_t version = 0;
  uint32_t section_count = 0;
  uint64_t file_size = 0;
  uint64_t table_checksum = 0;
  uint64_t header_checksum = 0;
};

// Magic, version, header checksum, reserved bytes and file size: everything that can be judged
// from the 64-byte header and the buffer's length.
Status check_header(ByteSpan bytes, const std::string& name, Header* h) {
  // A foreign file is named as such even when it is shorter than a header.
  size_t magic_len = std::min(bytes.size, sizeof kMagic);
  if (magic_len == 0 || std::memcmp(bytes.data, kMagic, magic_len) != 0)
    return format_error(name, "header", "not a Foundry container (bad magic)");
  if (bytes.size < kContainerHeaderSize)
    return format_error(name, "header", "truncated: the file is " + std::to_string(bytes.size) +
                                            " bytes, shorter than the " + std::to_string(kContainerHeaderSize) +
                                            "-byte header");
  ByteReader r(bytes.data, kContainerHeaderSize);
  r.skip(sizeof kMagic);
  r.u32(&h->version);
  r.u32(&h->section_count);
  r.u64(&h->file_size);
  r.u64(&h->table_checksum);
  r.u64(&h->header_checksum);
  FOUNDRY_RETURN_IF_ERROR(r.status((name + " header").c_str()));

  // The version is judged before any checksum: a newer version may checksum differently, and its
  // reader should be told "too new", not "corrupt".
  if (h->version == 0)
    return format_error(name, "header", "invalid format version 0");
  if (h->version > kContainerVersion)
    return Error(FOUNDRY_ERR_VERSION, name + ": header: container format version " + std::to_string(h->version) +
                                          " is newer than this build reads (version " +
                                          std::to_string(kContainerVersion) + ")");
  uint64_t computed = hash64(bytes.data, kHeaderChecksummed);
  if (computed != h->header_checksum) return checksum_error(name, "header", h->header_checksum, computed);
  if (!all_zero(bytes.data + kHeaderReservedStart, kContainerHeaderSize - kHeaderReservedStart))
    return format_error(name, "header", "reserved bytes 40..63 are not zero");
  if (h->file_size > bytes.size)
    return format_error(name, "header", "truncated: the header records " + std::to_string(h->file_size) +
                                            " bytes but the file has " + std::to_string(bytes.size));
  if (h->file_size < bytes.size)
    return format_error(name, "header", "extended: the file has " + std::to_string(bytes.size) +
                                            " bytes but the header records " + std::to_string(h->file_size));
  return Status::Ok();
}

// The table's bounds and checksum, then each entry decoded.
Status read_table(ByteSpan bytes, const std::string& name, const Header& h,
                  std::vector<Section>* out) {
  // Divide rather than multiply so a hostile count cannot overflow.
  size_t room = bytes.size - kContainerHeaderSize;
  if (h.section_count > room / kContainerEntrySize)
    return format_error(name, "section table", "truncated: " + std::to_string(h.section_count) + " entries of " +
                                                   std::to_string(kContainerEntrySize) + " bytes do not fit in the " +
                                                   std::to_string(room) + " bytes after the header");
  size_t table_size = static_cast<size_t>(h.section_count) * kContainerEntrySize;
  const uint8_t* table = bytes.data + kContainerHeaderSize;
  uint64_t computed = hash64(table, table_size);
  if (computed != h.table_checksum) return checksum_error(name, "section table", h.table_checksum, computed);

  ByteReader r(table, table_size);
  out->resize(h.section_count);  // bounded by the file size above
  for (Section& s : *out) {
    r.u32(&s.type);
    r.u32(&s.flags);
    r.u64(&s.offset);
    r.u64(&s.size);
    r.u64(&s.checksum);
  }
  return r.status((name + " section table").c_str());
}

// Each section inside the data area and aligned; sections pairwise disjoint; every byte outside
// the sections zero (so that padding cannot carry unchecked data).
Status check_layout(ByteSpan bytes, const std::string& name, const std::vector<Section>& sections) {
  const uint64_t file_size = bytes.size;
  const uint64_t data_start = kContainerHeaderSize + sections.size() * kContainerEntrySize;
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
    std::string where = section_label(i, s);
    if (s.offset < data_start)
      return format_error(name, where, "offset " + std::to_string(s.offset) +
                                           " lies inside the header or section table (data starts at " +
                                           std::to_string(data_start) + ")");
    if (s.offset % 8 != 0)
      return format_error(name, where, "offset " + std::to_string(s.offset) + " is not 8-byte aligned");
    if (s.offset > file_size || s.size > file_size - s.offset)
      return format_error(name, where, "bytes [" + std::to_string(s.offset) + ", +" + std::to_string(s.size) +
                                           ") run past the end of the " + std::to_string(file_size) + "-byte file");
  }

  // Empty sections occupy no bytes, so they can neither overlap nor cover padding.
  std::vector<size_t> order;
  for (size_t i = 0; i < sections.size(); ++i)
    if (sections[i].size != 0) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return sections[a].offset < sections[b].offset; });

  uint64_t cursor = data_start;
  const Section* prev = nullptr;
  size_t prev_index = 0;
  for (size_t i : order) {
    const Section& s = sections[i];
    // cursor is the end of the previous section (or data_start, which every offset passed above).
    if (s.offset < cursor)
      return format_error(name, section_label(i, s),
                          "overlaps " + (prev ? section_label(prev_index, *prev) : std::string("the section table")) +
                              " at offset " + std::to_string(s.offset));
    if (!all_zero(bytes.data + cursor, s.offset - cursor))
      return format_error(name, "padding before " + section_label(i, s), "non-zero bytes in [" +
                                                                           std::to_string(cursor) + ", " +
                                                                           std::to_string(s.offset) + ")");
    cursor = s.offset + s.size;
    prev = &s;
    prev_index = i;
  }
  if (!all_zero(bytes.data + cursor, file_size - cursor))
    return format_error(name, "trailing padding",
                        "non-zero bytes in [" + std::to_string(cursor) + ", " + std::to_string(file_size) + ")");
  return Status::Ok();
}

// Hashing runs at several GB/s on one core: a payload of 80 MB is worth spreading over threads,
// each taking whole sections (XXH64 of one section cannot be split).
constexpr uint64_t kChecksumBytesPerThread = 4 << 20;

Status check_section_checksums(ByteSpan bytes, const std::string& name,
                               const std::vector<Section>& sections) {
  uint64_t total = 0;
  for (const Section& s : sections) total += s.size;
  std::vector<uint64_t> computed(sections.size());
  parallel_for(sections.size(), work_threads(total / kChecksumBytesPerThread), [&](size_t i) {
    const Section& s = sections[i];
    // Bounds were checked by check_layout; an empty section may sit at the very end of the file.
    computed[i] = hash64(s.size == 0 ? nullptr : bytes.data + s.offset, static_cast<size_t>(s.size));
  });
  // Every section is hashed before any is judged, so the first bad one in table order is reported.
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
    if (computed[i] != s.checksum) return checksum_error(name, section_label(i, s), s.checksum, computed[i]);
  }
  return Status::Ok();
}

}  // namespace

void ContainerWriter::add(uint32_t type, std::vector<uint8_t> bytes, uint32_t flags) {
  sections_.push_back(Pending{type, flags, std::move(bytes)});
}

std::vector<uint8_t> ContainerWriter::finish() const {
  // Lay the sections out first: the table records offsets that depend on every earlier size.
  uint64_t cursor = kContainerHeaderSize + sections_.size() * kContainerEntrySize;
  std::vector<uint64_t> offsets;
  offsets.reserve(sections_.size());
  for (const Pending& p : sections_) {
    cursor = align8(cursor);
    offsets.push_back(cursor);
    cursor += p.bytes.size();
  }
  const uint64_t file_size = cursor;

  ByteWriter w;
  w.raw(kMagic, sizeof kMagic);
  w.u32(kContainerVersion);
  w.u32(static_cast<uint32_t>(sections_.size()));
  w.u64(file_size);
  const size_t table_checksum_at = w.size();
  w.u64(0);  // table checksum, patched below
  const size_t header_checksum_at = w.size();
  w.u64(0);  // header checksum, patched below
  w.pad_to(kContainerHeaderSize);

  for (size_t i = 0; i < sections_.size(); ++i) {
    const Pending& p = sections_[i];
    w.u32(p.type);
    w.u32(p.flags);
    w.u64(offsets[i]);
    w.u64(p.bytes.size());
    w.u64(hash64(p.bytes.data(), p.bytes.size()));
  }
  for (const Pending& p : sections_) {
    w.pad_to(8);
    w.raw(p.bytes.data(), p.bytes.size());
  }
  std::vector<uint8_t> out = w.take();  // out.size() == file_size: the same layout as above

  uint64_t table_checksum =
      hash64(out.data() + kContainerHeaderSize, sections_.size() * kContainerEntrySize);
  for (int i = 0; i < 8; ++i) out[table_checksum_at + i] = static_cast<uint8_t>(table_checksum >> (8 * i));
  uint64_t header_checksum = hash64(out.data(), kHeaderChecksummed);
  for (int i = 0; i < 8; ++i) out[header_checksum_at + i] = static_cast<uint8_t>(header_checksum >> (8 * i));
  return out;
}

Status write_container_file(const std::string& path, const ContainerWriter& writer) {
  std::vector<uint8_t> bytes = writer.finish();
  return write_file_atomic(path, bytes.data(), bytes.size());
}

Result<Container> Container::parse(std::vector<uint8_t> bytes, const std::string& name_for_errors) {
  return parse_file_bytes(FileBytes(std::move(bytes)), name_for_errors);
}

Result<Container> Container::parse_file_bytes(FileBytes bytes, const std::string& name_for_errors) {
  const ByteSpan span = bytes.span();
  Header h;
  FOUNDRY_RETURN_IF_ERROR(check_header(span, name_for_errors, &h));
  std::vector<Section> sections;
  FOUNDRY_RETURN_IF_ERROR(read_table(span, name_for_errors, h, &sections));
  FOUNDRY_RETURN_IF_ERROR(check_layout(span, name_for_errors, sections));
  FOUNDRY_RETURN_IF_ERROR(check_section_checksums(span, name_for_errors, sections));

  Container c;
  c.name_ = name_for_errors;
  c.version_ = h.version;
  c.bytes_ = std::move(bytes);
  c.sections_ = std::move(sections);
  return Result<Container>(std::move(c));
}

Result<Container> Container::read_file(const std::string& path, uint64_t max_size) {
  auto bytes = FileBytes::read(path, max_size);
  if (!bytes.ok()) return bytes.status();
  return parse_file_bytes(std::move(bytes.value()), path);
}

const Section* Container::find(uint32_t type) const {
  for (const Section& s : sections_)
    if (s.type == type) return &s;
  return nullptr;
}

std::vector<const Section*> Container::find_all(uint32_t type) const {
  std::vector<const Section*> out;
  for (const Section& s : sections_)
    if (s.type == type) out.push_back(&s);
  return out;
}

ByteSpan Container::data(const Section& section) const {
  // Sections from this container were validated; anything else gets an empty view, not a wild read.
  if (section.size == 0 || section.offset > bytes_.size() || section.size > bytes_.size() - section.offset)
    return ByteSpan{};
  return ByteSpan{bytes_.data() + section.offset, static_cast<size_t>(section.size)};
}

Status read_section_again(const OpenFile& file, const Section& section, const std::string& name, uint8_t* out) {
  FOUNDRY_RETURN_IF_ERROR(file.read_at(section.offset, static_cast<size_t>(section.size), out, name));
  uint64_t computed = hash64(out, static_cast<size_t>(section.size));
  if (computed != section.checksum) {
    return Error(FOUNDRY_ERR_MISMATCH, name + ": checksum mismatch (stored " + hex(section.checksum) + ", computed " +
                                           hex(computed) + "): the file changed after it was opened");
  }
  return Status::Ok();
}

Result<ByteReader> Container::reader(uint32_t type) const {
  const Section* s = find(type);
  if (s == nullptr)
    return Error(FOUNDRY_ERR_NOT_FOUND, name_ + ": no section of type " + std::to_string(type));
  return ByteReader(data(*s));
}

}  // namespace foundry
