// Parsing of CUDA kernel images. See image_format.h for the contract.
//
// Fatbin layout, verified on fatbins written by nvcc 13.0 (V13.0.88) with --fatbin for
// sm_80/sm_90/compute_90, sm_90a, sm_100a, sm_100f, sm_120, lto_90, -G, -rdc, and with the
// default compression, -Xfatbin -compress-all, -Xfatbin -compress-mode=speed and --no-compress:
//
//   container header (16 bytes): u32 magic 0xBA55ED50, u16 version (1), u16 header_size (16),
//                                u64 payload_size (the entries, which tile it exactly).
//   entry, fixed 64-byte header (all little-endian):
//     0x00 u16 kind            1 PTX, 2 ELF cubin, 8 LTO-IR
//     0x02 u16 (always 0x0101)
//     0x04 u32 header_size     64 for plain cubins; 72 with a file name (-G); 80-120 when an
//                              extension follows at 0x40 (PTX, sm_100+, LTO): always honour it
//     0x08 u64 payload_size    bytes after the header, padded to 8 (payload at entry+header_size)
//     0x10 u32 compressed_size 0 when uncompressed
//     0x14 u32                 0x40 when the header has an extension at 0x40, else 0
//     0x18 u16 minor, 0x1a u16 major   (cubin 1.8; PTX the ISA version, 9.0)
//     0x1c u32 arch            80, 90, 100, 120: sm_XX / compute_XX
//     0x20 u32 name_offset, 0x24 u32 name_size  (relative to the entry; -G puts the .cu name here)
//     0x28 u64 flags           0x1|0x10 always; 0x2 debug; 0x2000 LZ4-compressed
//                              (-compress-mode=speed); 0x8000 zstd-compressed (default codec:
//                              payload starts 28 b5 2f fd); 0x100000 sm_XXa; 0x200000 sm_XXf;
//                              0x1000000 on sm_100+ entries
//     0x30 u64                 0, except on LTO-IR entries
//     0x38 u64 uncompressed_size  0 when uncompressed
//   The commonly documented "0x2000 = compressed" is only the LZ4 codec; nvcc 13 compresses with
//   zstd (0x8000) by default, and by default compresses PTX (and relocatable -rdc cubins) but not
//   executable cubins. An uncompressed cubin payload starts with the ELF magic and is
//   byte-identical to `nvcc -cubin` output for the same arch (its payload_size equals the file).
//
// __fatBinC_Wrapper_t: verified on a two-translation-unit -rdc shared library. The per-TU
// wrappers (__fatbinwrap_*) are version 1 and point into __nv_relfatbin; the device-link stub's
// __fatDeviceText (first in .nvFatBinSegment) is version 2 with data = the linked fatbin in
// .nv_fatbin and filename_or_fatbins = a NULL-terminated array of the per-TU fatbins (filled in
// by the registration constructors at load). Adjacent TUs' fatbins sit back to back in those
// sections, so a wrapper segment is measured as exactly one container.
//
// Cubin kernels: nvcc 13 marks kernel symbols STT_FUNC, STB_GLOBAL, st_other 0x10
// (STO_CUDA_ENTRY). __noinline__ device functions are also STT_FUNC with their own
// .text.<name> section but st_other 0, and undefined externals (-rdc) are STT_FUNC with
// st_shndx 0. Cubins are ELFCLASS64, ELFDATA2LSB, e_machine 190, EI_OSABI 0x41.
#include "modules/image_format.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/hash.h"

namespace foundry {
namespace {

// ---- bounds-checked little-endian reads ------------------------------------------------------

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// True when [off, off+len) lies within [0, size), without overflow.
bool in_bounds(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

Status format_error(const std::string& what) { return Error(FOUNDRY_ERR_FORMAT, what); }

// ---- readability of process memory -----------------------------------------------------------

// A wrapper's pointers cannot be bounds-checked, but they can be checked for being mapped and
// readable: process_vm_readv on our own pid reports EFAULT instead of faulting. One byte per page
// is enough since protection is per page. Where the call is unavailable (seccomp), assume
// readable: the wrapper came from a load call that the driver itself would dereference.
bool memory_readable(const void* ptr, size_t size) {
  if (size == 0) return true;
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  if (start == 0 || size - 1 > UINTPTR_MAX - start) return false;
  const uintptr_t last = start + (size - 1);
  const long page_long = sysconf(_SC_PAGESIZE);
  const uintptr_t page = page_long > 0 ? uintptr_t(page_long) : 4096;
  constexpr int kBatch = 1024;  // IOV_MAX
  char sink[kBatch];
  iovec remote[kBatch];
  uintptr_t addr = start;
  // One probe per page: `start`, then the first byte of every later page up to `last`.
  bool done = false;
  while (!done) {
    int count = 0;
    while (count < kBatch && !done) {
      remote[count].iov_base = reinterpret_cast<void*>(addr);
      remote[count].iov_len = 1;
      ++count;
      const uintptr_t next = (addr & ~(page - 1)) + page;
      done = next <= addr || next > last;  // (next <= addr: wrapped at the top of memory)
      addr = next;
    }
    iovec local{sink, size_t(count)};
    // A failing remote range ends the transfer early (partial count) or fails it with EFAULT.
    const ssize_t got = process_vm_readv(getpid(), &local, 1, remote, count, 0);
    if (got == count) continue;
    return got < 0 && (errno == ENOSYS || errno == EPERM);
  }
  return true;
}

// ---- fatbin ----------------------------------------------------------------------------------

constexpr size_t kContainerHeaderMin = 16;
constexpr size_t kEntryHeaderMin = 64;
// Container headers are 16 bytes in every known version; anything huge is corruption.
constexpr size_t kContainerHeaderMax = 4096;

struct Container {
  size_t header_size;
  uint64_t payload_size;
  size_t total;
};

Result<Container> read_container(const uint8_t* data, size_t size, size_t at) {
  if (!in_bounds(at, kContainerHeaderMin, size))
    return format_error("fatbin container header at offset " + std::to_string(at) +
                        " truncated (" + std::to_string(size) + " bytes available)");
  const uint8_t* p = data + at;
  if (load<uint32_t>(p) != kFatbinMagic)
    return format_error("no fatbin magic at offset " + std::to_string(at) + " (found " +
                        hex(load<uint32_t>(p)) + ")");
  Container c;
  c.header_size = load<uint16_t>(p + 6);
  c.payload_size = load<uint64_t>(p + 8);
  if (c.header_size < kContainerHeaderMin || c.header_size > kContainerHeaderMax)
    return format_error("fatbin container at offset " + std::to_string(at) +
                        " has implausible header size " + std::to_string(c.header_size));
  if (c.payload_size > kMaxImageBytes)
    return format_error("fatbin container at offset " + std::to_string(at) + " claims " +
                        std::to_string(c.payload_size) + " payload bytes (limit " +
                        std::to_string(kMaxImageBytes) + ")");
  c.total = c.header_size + size_t(c.payload_size);
  if (!in_bounds(at, c.total, size))
    return format_error("fatbin container at offset " + std::to_string(at) + " needs " +
                        std::to_string(c.total) + " bytes but only " + std::to_string(size - at) +
                        " are available");
  return c;
}

bool has_magic_at(const uint8_t* data, size_t size, size_t at, uint32_t magic) {
  return in_bounds(at, 4, size) && load<uint32_t>(data + at) == magic;
}

// Parses the entries of one container's payload [begin, end) of data, appending to out.
Status read_entries(const uint8_t* data, size_t begin, size_t end, std::vector<FatbinEntry>* out) {
  size_t at = begin;
  while (at < end) {
    // Tolerate zero padding after the last entry (not seen from nvcc 13, but harmless).
    if (end - at < kEntryHeaderMin || (load<uint16_t>(data + at) == 0 &&
                                       load<uint32_t>(data + at + 4) == 0)) {
      for (size_t i = at; i < end; ++i)
        if (data[i] != 0)
          return format_error("fatbin entry header at offset " + std::to_string(at) +
                              " truncated or corrupt");
      break;
    }
    const uint8_t* p = data + at;
    FatbinEntry e;
    e.kind = load<uint16_t>(p);
    const uint32_t header_size = load<uint32_t>(p + 0x04);
    const uint64_t payload_size = load<uint64_t>(p + 0x08);
    e.compressed_size = load<uint32_t>(p + 0x10);
    e.minor = load<uint16_t>(p + 0x18);
    e.major = load<uint16_t>(p + 0x1a);
    e.arch = load<uint32_t>(p + 0x1c);
    const uint32_t name_offset = load<uint32_t>(p + 0x20);
    const uint32_t name_size = load<uint32_t>(p + 0x24);
    e.flags = load<uint64_t>(p + 0x28);
    e.uncompressed_size = load<uint64_t>(p + 0x38);
    if (header_size < kEntryHeaderMin || !in_bounds(at, header_size, end))
      return format_error("fatbin entry at offset " + std::to_string(at) + " has header size " +
                          std::to_string(header_size) + " outside its container");
    if (!in_bounds(at + header_size, payload_size, end))
      return format_error("fatbin entry at offset " + std::to_string(at) + " has payload of " +
                          std::to_string(payload_size) + " bytes past the end of its container");
    const uint64_t entry_size = header_size + payload_size;
    // A nonzero compressed size without a known codec bit is still not usable as-is.
    e.compressed = (e.flags & (kFatbinFlagCompressedLz4 | kFatbinFlagCompressedZstd)) != 0 ||
                   e.compressed_size != 0;
    if (e.compressed && e.compressed_size > payload_size)
      return format_error("fatbin entry at offset " + std::to_string(at) + " claims " +
                          std::to_string(e.compressed_size) + " compressed bytes in a payload of " +
                          std::to_string(payload_size));
    if (name_size > 0) {
      if (!in_bounds(name_offset, name_size, entry_size))
        return format_error("fatbin entry at offset " + std::to_string(at) +
                            " has a name outside the entry");
      const char* name = reinterpret_cast<const char*>(p + name_offset);
      e.name.assign(name, strnlen(name, name_size));
    }
    e.payload = p + header_size;
    e.payload_size = size_t(payload_size);
    out->push_back(std::move(e));
    at += size_t(entry_size);
  }
  return Status::Ok();
}

// ---- ELF -------------------------------------------------------------------------------------

constexpr size_t kElfHeaderSize = 64;
constexpr size_t kElfShdrSize = 64;
constexpr size_t kElfPhdrSize = 56;
constexpr size_t kElfSymSize = 24;
constexpr uint32_t kShtNull = 0;
constexpr uint32_t kShtSymtab = 2;
constexpr uint32_t kShtStrtab = 3;
constexpr uint32_t kShtNobits = 8;
constexpr uint16_t kPnXnum = 0xffff;
constexpr uint8_t kSttFunc = 2;
constexpr uint8_t kStoCudaEntry = 0x10;

struct ElfLayout {
  uint64_t shoff = 0;
  uint64_t shnum = 0;
  uint64_t phoff = 0;
  uint64_t phnum = 0;
  size_t size = 0;  // measured image size
};

struct SectionHeader {
  uint32_t type;
  uint64_t offset;
  uint64_t size;
  uint32_t link;
  uint32_t info;
  uint64_t entsize;
};

SectionHeader section_at(const uint8_t* data, const ElfLayout& elf, uint64_t index) {
  const uint8_t* p = data + elf.shoff + index * kElfShdrSize;
  SectionHeader s;
  s.type = load<uint32_t>(p + 4);
  s.offset = load<uint64_t>(p + 24);
  s.size = load<uint64_t>(p + 32);
  s.link = load<uint32_t>(p + 40);
  s.info = load<uint32_t>(p + 44);
  s.entsize = load<uint64_t>(p + 56);
  return s;
}

bool is_elf64_le(const uint8_t* p, size_t size) {
  return size >= 6 && p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2 &&
         p[5] == 1;
}

// Validates the header tables and every section/segment extent; measures the image.
Result<ElfLayout> parse_elf(const uint8_t* data, size_t max_size) {
  if (max_size < kElfHeaderSize)
    return format_error("ELF header truncated (" + std::to_string(max_size) + " of " +
                        std::to_string(kElfHeaderSize) + " bytes)");
  if (!is_elf64_le(data, max_size))
    return format_error("not a 64-bit little-endian ELF image");
  ElfLayout elf;
  elf.phoff = load<uint64_t>(data + 32);
  elf.shoff = load<uint64_t>(data + 40);
  const uint16_t ehsize = load<uint16_t>(data + 52);
  const uint16_t phentsize = load<uint16_t>(data + 54);
  elf.phnum = load<uint16_t>(data + 56);
  const uint16_t shentsize = load<uint16_t>(data + 58);
  elf.shnum = load<uint16_t>(data + 60);
  if (ehsize < kElfHeaderSize) return format_error("ELF header size " + std::to_string(ehsize) + " < 64");
  uint64_t end = kElfHeaderSize;

  if (elf.shoff != 0) {
    if (shentsize != kElfShdrSize)
      return format_error("ELF section header entry size " + std::to_string(shentsize) + " != 64");
    // Extended numbering: counts that do not fit in the header live in section header 0.
    if (elf.shnum == 0 || elf.phnum == kPnXnum) {
      if (!in_bounds(elf.shoff, kElfShdrSize, max_size))
        return format_error("ELF section header 0 at " + std::to_string(elf.shoff) + " past end of image");
      SectionHeader s0 = section_at(data, elf, 0);
      if (elf.shnum == 0) elf.shnum = s0.size;
      if (elf.phnum == kPnXnum) elf.phnum = s0.info;
    }
    if (elf.shnum > max_size / kElfShdrSize || !in_bounds(elf.shoff, elf.shnum * kElfShdrSize, max_size))
      return format_error("ELF section header table (" + std::to_string(elf.shnum) + " entries at " +
                          std::to_string(elf.shoff) + ") past end of image (" +
                          std::to_string(max_size) + " bytes)");
    end = std::max<uint64_t>(end, elf.shoff + elf.shnum * kElfShdrSize);
  } else if (elf.shnum != 0) {
    return format_error("ELF header lists " + std::to_string(elf.shnum) +
                        " sections but no section header table");
  }

  if (elf.phnum > 0) {
    if (phentsize != kElfPhdrSize)
      return format_error("ELF program header entry size " + std::to_string(phentsize) + " != 56");
    if (elf.phnum > max_size / kElfPhdrSize || !in_bounds(elf.phoff, elf.phnum * kElfPhdrSize, max_size))
      return format_error("ELF program header table (" + std::to_string(elf.phnum) + " entries at " +
                          std::to_string(elf.phoff) + ") past end of image (" +
                          std::to_string(max_size) + " bytes)");
    end = std::max<uint64_t>(end, elf.phoff + elf.phnum * kElfPhdrSize);
    for (uint64_t i = 0; i < elf.phnum; ++i) {
      const uint8_t* ph = data + elf.phoff + i * kElfPhdrSize;
      const uint64_t off = load<uint64_t>(ph + 8);
      const uint64_t filesz = load<uint64_t>(ph + 32);
      if (!in_bounds(off, filesz, max_size))
        return format_error("ELF segment " + std::to_string(i) + " data [" + std::to_string(off) +
                            ", +" + std::to_string(filesz) + ") past end of image (" +
                            std::to_string(max_size) + " bytes)");
      end = std::max<uint64_t>(end, off + filesz);
    }
  }

  for (uint64_t i = 1; i < elf.shnum; ++i) {
    SectionHeader s = section_at(data, elf, i);
    if (s.type == kShtNull || s.type == kShtNobits) continue;
    if (!in_bounds(s.offset, s.size, max_size))
      return format_error("ELF section " + std::to_string(i) + " data [" + std::to_string(s.offset) +
                          ", +" + std::to_string(s.size) + ") past end of image (" +
                          std::to_string(max_size) + " bytes)");
    end = std::max<uint64_t>(end, s.offset + s.size);
  }
  if (end > kMaxImageBytes)
    return format_error("ELF image of " + std::to_string(end) + " bytes exceeds the limit of " +
                        std::to_string(kMaxImageBytes));
  elf.size = size_t(end);
  return elf;
}

// ---- PTX -------------------------------------------------------------------------------------

bool is_text_byte(uint8_t c) {
  // Printable ASCII, the usual whitespace, and bytes of UTF-8 sequences (comments may hold them).
  return (c >= 0x20 && c != 0x7f) || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// ---- wrappers --------------------------------------------------------------------------------

// The layout of __fatBinC_Wrapper_t on LP64 (fatbinary_section.h).
struct WrapperLayout {
  int32_t magic;
  int32_t version;
  const unsigned long long* data;
  void* filename_or_fatbins;
};
static_assert(sizeof(WrapperLayout) == 24, "__fatBinC_Wrapper_t is 24 bytes on LP64");

// More prelinked fatbins than this means the array lost its NULL terminator.
constexpr size_t kMaxWrapperSegments = 1u << 16;

// Measures one fatbin container in process memory (a wrapper's pointee).
Result<Segment> read_pointed_fatbin(const void* ptr, const std::string& what) {
  if (ptr == nullptr) return format_error(what + " is a null pointer");
  if (!memory_readable(ptr, kContainerHeaderMin))
    return format_error(what + " (" + hex(reinterpret_cast<uintptr_t>(ptr)) + ") is not readable memory");
  const uint8_t* p = static_cast<const uint8_t*>(ptr);
  // The header gives the extent; then the whole extent must be readable before it is walked.
  Result<Container> head = read_container(p, kContainerHeaderMin + kMaxImageBytes, 0);
  if (!head.ok()) return Status(head.status().code(), what + ": " + head.status().message());
  const size_t total = head.value().total;
  if (!memory_readable(p, total))
    return format_error(what + ": its " + std::to_string(total) + " bytes are not all readable memory");
  std::vector<FatbinEntry> entries;
  Status st = read_entries(p, head.value().header_size, total, &entries);
  if (!st.ok()) return Status(st.code(), what + ": " + st.message());
  return Segment{p, total};
}

Result<ImageView> inspect_wrapper(const uint8_t* data, size_t max_size) {
  if (max_size < sizeof(WrapperLayout))
    return format_error("fatbin wrapper truncated (" + std::to_string(max_size) + " of " +
                        std::to_string(sizeof(WrapperLayout)) + " bytes)");
  WrapperLayout w;
  std::memcpy(&w, data, sizeof(w));
  ImageView view;
  view.kind = ImageKind::kFatbinWrapper;
  view.wrapper_version = w.version;
  if (w.version != 1 && w.version != 2)
    return Error(FOUNDRY_ERR_VERSION, "fatbin wrapper version " + std::to_string(w.version) +
                                          " is not 1 or 2");
  if (w.data != nullptr || w.version == 1) {
    Result<Segment> seg = read_pointed_fatbin(w.data, "fatbin wrapper data");
    if (!seg.ok()) return seg.status();
    view.segments.push_back(seg.value());
  }
  if (w.version == 2 && w.filename_or_fatbins != nullptr) {
    const void* const* array = static_cast<const void* const*>(w.filename_or_fatbins);
    for (size_t i = 0;; ++i) {
      if (i >= kMaxWrapperSegments)
        return format_error("fatbin wrapper v2: more than " + std::to_string(kMaxWrapperSegments) +
                            " prelinked fatbins (missing NULL terminator?)");
      if (!memory_readable(array + i, sizeof(void*)))
        return format_error("fatbin wrapper v2: prelinked fatbin array entry " + std::to_string(i) +
                            " is not readable memory");
      const void* ptr = array[i];
      if (ptr == nullptr) break;
      Result<Segment> seg = read_pointed_fatbin(ptr, "fatbin wrapper v2 prelinked fatbin " + std::to_string(i));
      if (!seg.ok()) return seg.status();
      view.segments.push_back(seg.value());
    }
  }
  if (view.segments.empty())
    return format_error("fatbin wrapper v2 has neither data nor prelinked fatbins");
  for (const Segment& s : view.segments) view.total_size += s.size;
  return view;
}

Result<ImageView> single_segment(ImageKind kind, const uint8_t* data, Result<size_t> size) {
  if (!size.ok()) return size.status();
  ImageView view;
  view.kind = kind;
  view.segments.push_back(Segment{data, size.value()});
  view.total_size = size.value();
  return view;
}

// Entry preference for one arch: the most specific build is what the driver would pick.
int variant_rank(const FatbinEntry& e) {
  if (e.flags & kFatbinFlagArchSpecific) return 0;
  if (e.flags & kFatbinFlagFamilySpecific) return 1;
  return 2;
}

}  // namespace

ImageKind classify_image(const void* data, size_t max_size) {
  if (data == nullptr || max_size == 0) return ImageKind::kUnknown;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (max_size >= 4) {
    const uint32_t magic = load<uint32_t>(p);
    if (magic == kFatbinWrapperMagic) return ImageKind::kFatbinWrapper;
    if (magic == kFatbinMagic) return ImageKind::kFatbin;
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F')
      return is_elf64_le(p, max_size) ? ImageKind::kCubin : ImageKind::kUnknown;
  }
  return is_text_byte(p[0]) && p[0] < 0x80 ? ImageKind::kPtx : ImageKind::kUnknown;
}

Result<size_t> fatbin_container_size(const uint8_t* data, size_t max_size) {
  if (data == nullptr) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "fatbin pointer is null");
  Result<Container> c = read_container(data, max_size, 0);
  if (!c.ok()) return c.status();
  return c.value().total;
}

Result<size_t> fatbin_size(const uint8_t* data, size_t max_size) {
  if (data == nullptr) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "fatbin pointer is null");
  size_t at = 0;
  do {
    Result<Container> c = read_container(data, max_size, at);
    if (!c.ok()) return c.status();
    at += c.value().total;
    if (at > kMaxImageBytes)
      return format_error("fatbin of more than " + std::to_string(kMaxImageBytes) + " bytes");
  } while (has_magic_at(data, max_size, at, kFatbinMagic));
  return at;
}

Result<size_t> elf_image_size(const uint8_t* data, size_t max_size) {
  if (data == nullptr) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "ELF pointer is null");
  Result<ElfLayout> elf = parse_elf(data, max_size);
  if (!elf.ok()) return elf.status();
  return elf.value().size;
}

Result<size_t> ptx_size(const uint8_t* data, size_t max_size) {
  if (data == nullptr) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "PTX pointer is null");
  const size_t limit = std::min<uint64_t>(max_size, kMaxImageBytes);
  for (size_t i = 0; i < limit; ++i) {
    if (data[i] == 0) return i + 1;
    if (!is_text_byte(data[i]))
      return format_error("PTX text has control byte " + hex(data[i]) + " at offset " + std::to_string(i));
  }
  return format_error("PTX text has no NUL terminator within " + std::to_string(limit) + " bytes");
}

Result<ImageView> inspect_image(const void* data, size_t max_size) {
  if (data == nullptr) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "image pointer is null");
  const uint8_t* p = static_cast<const uint8_t*>(data);
  switch (classify_image(data, max_size)) {
    case ImageKind::kFatbinWrapper:
      return inspect_wrapper(p, max_size);
    case ImageKind::kFatbin: {
      Result<size_t> size = fatbin_size(p, max_size);
      if (!size.ok()) return size.status();
      // Walk the entries too, so a container whose sizes add up but whose contents do not is
      // refused here rather than by whoever extracts from it later.
      Result<std::vector<FatbinEntry>> entries = list_fatbin_entries(p, size.value());
      if (!entries.ok()) return entries.status();
      return single_segment(ImageKind::kFatbin, p, size);
    }
    case ImageKind::kCubin:
      return single_segment(ImageKind::kCubin, p, elf_image_size(p, max_size));
    case ImageKind::kPtx:
      return single_segment(ImageKind::kPtx, p, ptx_size(p, max_size));
    case ImageKind::kUnknown:
      break;
  }
  std::string first;
  for (size_t i = 0; i < std::min<size_t>(max_size, 4); ++i) first += (i ? " " : "") + hex(p[i]);
  return format_error("not a CUDA image (first bytes: " + (first.empty() ? "none" : first) + ")");
}

uint64_t image_content_hash(const ImageView& view) {
  Hasher64 h;
  for (const Segment& s : view.segments) h.update(s.data, s.size);
  return h.digest();
}

Result<std::vector<FatbinEntry>> list_fatbin_entries(const uint8_t* data, size_t size) {
  if (data == nullptr) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "fatbin pointer is null");
  std::vector<FatbinEntry> entries;
  size_t at = 0;
  do {
    Result<Container> c = read_container(data, size, at);
    if (!c.ok()) return c.status();
    Status st = read_entries(data, at + c.value().header_size, at + c.value().total, &entries);
    if (!st.ok()) return st;
    at += c.value().total;
  } while (has_magic_at(data, size, at, kFatbinMagic));
  return entries;
}

Result<std::vector<uint8_t>> extract_cubin(const uint8_t* fatbin, size_t size, int arch) {
  if (arch <= 0) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "arch " + std::to_string(arch) + " is not a compute capability");
  Result<std::vector<FatbinEntry>> entries = list_fatbin_entries(fatbin, size);
  if (!entries.ok()) return entries.status();
  const FatbinEntry* best = nullptr;
  for (const FatbinEntry& e : entries.value()) {
    if (e.kind != kFatbinEntryCubin || e.arch != uint32_t(arch) || e.compressed) continue;
    if (best == nullptr || variant_rank(e) < variant_rank(*best)) best = &e;
  }
  if (best == nullptr) return std::vector<uint8_t>();
  Result<size_t> elf_size = elf_image_size(best->payload, best->payload_size);
  if (!elf_size.ok())
    return Status(elf_size.status().code(), "sm_" + std::to_string(arch) +
                                                " cubin entry is not a valid ELF: " + elf_size.status().message());
  return std::vector<uint8_t>(best->payload, best->payload + elf_size.value());
}

Result<std::vector<std::string>> cubin_kernel_names(const uint8_t* data, size_t size) {
  if (data == nullptr) return Error(FOUNDRY_ERR_INVALID_ARGUMENT, "ELF pointer is null");
  Result<ElfLayout> parsed = parse_elf(data, size);
  if (!parsed.ok()) return parsed.status();
  const ElfLayout& elf = parsed.value();
  std::vector<std::string> names;
  // parse_elf has already checked every section's extent against size.
  for (uint64_t i = 1; i < elf.shnum; ++i) {
    const SectionHeader symtab = section_at(data, elf, i);
    if (symtab.type != kShtSymtab) continue;
    if (symtab.entsize < kElfSymSize)
      return format_error("ELF symbol table (section " + std::to_string(i) + ") has entry size " +
                          std::to_string(symtab.entsize));
    if (symtab.link == 0 || symtab.link >= elf.shnum)
      return format_error("ELF symbol table (section " + std::to_string(i) + ") links to string table " +
                          std::to_string(symtab.link) + " which does not exist");
    const SectionHeader strtab = section_at(data, elf, symtab.link);
    if (strtab.type != kShtStrtab)
      return format_error("ELF symbol table (section " + std::to_string(i) + ") links to section " +
                          std::to_string(symtab.link) + " which is not a string table");
    const char* strings = reinterpret_cast<const char*>(data + strtab.offset);
    const uint64_t count = symtab.size / symtab.entsize;
    for (uint64_t k = 1; k < count; ++k) {
      const uint8_t* sym = data + symtab.offset + k * symtab.entsize;
      const uint32_t name = load<uint32_t>(sym);
      const uint8_t info = sym[4];
      const uint8_t other = sym[5];
      const uint16_t shndx = load<uint16_t>(sym + 6);
      if ((info & 0xf) != kSttFunc || shndx == 0 || (other & kStoCudaEntry) == 0) continue;
      if (name >= strtab.size)
        return format_error("ELF symbol " + std::to_string(k) + " name offset " + std::to_string(name) +
                            " outside the string table");
      const size_t len = strnlen(strings + name, size_t(strtab.size - name));
      if (len == strtab.size - name)
        return format_error("ELF symbol " + std::to_string(k) + " name is not NUL-terminated");
      names.emplace_back(strings + name, len);
    }
  }
  return names;
}

}  // namespace foundry
