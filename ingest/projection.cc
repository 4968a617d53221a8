#include "ingest/projection.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace patchstore {
namespace {

uint64_t PageSize() {
  const long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<uint64_t>(p) : 4096;
}

// LMDB's page header (PAGEHDRSZ) before the data of an overflow page run.
constexpr uint64_t kLmdbPageHeader = 16;
// Bytes of one B-tree leaf entry besides key and data: node header (8) and
// the page's pointer to it (2).
constexpr uint64_t kLmdbNodeOverhead = 10;
// Leaf pages filled in key order are about half full after their splits:
// twice the entries' bytes.
constexpr uint64_t kLeafFill = 2;

// Bytes of the B-tree entry that points at a record on overflow pages:
// 10-byte key and an 8-byte page number.
constexpr uint64_t kRecordEntryBytes = (kLmdbNodeOverhead + 10 + 8) * kLeafFill;

// The record's bytes on disk plus its B-tree entry, and those of its mask
// block counts.
// Pages of any store: LMDB's two meta pages, the roots of the main and
// the four named databases, and the pages the last commits freed (LMDB
// reuses a page only once no snapshot can see it).
constexpr uint64_t kFixedPages = 18;

uint64_t RecordAndAux(const ProjectedRecord& r, DType dtype, uint16_t tile) {
  RecordHeader h = r.header;
  h.dtype = dtype;
  h.tile = tile;
  if (!FinalizeHeader(&h).ok()) return 0;
  uint64_t bytes = RecordDiskBytes(h) + kRecordEntryBytes;
  if (r.mask_blocks != 0) {
    auto bh = MaskBlocksHeader(h, r.mask_blocks);
    if (bh.ok()) bytes += RecordDiskBytes(*bh) + kRecordEntryBytes;
  }
  return bytes;
}

}  // namespace

uint64_t MachineRamBytes() {
  if (const char* env = std::getenv("PATCHSTORE_ASSUME_RAM_BYTES"); env != nullptr && *env >= '0' && *env <= '9') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (end != nullptr && *end == '\0' && v > 0) return v;
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  unsigned long long kib = 0;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemTotal:") return static_cast<uint64_t>(kib) * 1024;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  return pages > 0 ? static_cast<uint64_t>(pages) * PageSize() : 0;
}

uint64_t RecordDiskBytes(const RecordHeader& header) {
  const uint64_t page = PageSize();
  return ((header.record_bytes() + kLmdbPageHeader + page - 1) / page) * page;
}

std::string FormatBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

void StoreProjector::Add(const std::vector<ProjectedRecord>& records, uint64_t count, size_t id_bytes) {
  if (count == 0) return;
  // The sample's id (key 8, id, checksum 8) and index entries (key 8,
  // summary of 3 + 48 per field + checksum 8), and its entry in the sealed
  // index (lengths, id, summary).
  const uint64_t summary = 3 + 48 * records.size() + 8;
  uint64_t sample = (kLmdbNodeOverhead + 8 + id_bytes + 8) * kLeafFill + (kLmdbNodeOverhead + 8 + summary) * kLeafFill +
                    8 + id_bytes + summary;
  uint64_t advised = sample;
  for (const ProjectedRecord& r : records) {
    const RecordHeader& h = r.header;
    const bool chw = h.layout == Layout::kCHW;
    sample += RecordAndAux(r, h.dtype, h.tile);
    DType compact = RecordDType(FieldEncoding::kCompact, h.source_type, h.norm);
    if (DTypeSize(h.dtype) > DTypeSize(compact)) any_wider_than_compact_ = true;
    if (compact == DType::kFloat32 && h.dtype == DType::kFloat32) {
      // Half precision serves many float fields (depth, flow): named, the
      // user decides.
      compact = DType::kFloat16;
      if (std::find(half_fields_.begin(), half_fields_.end(), r.field) == half_fields_.end())
        half_fields_.push_back(r.field);
    }
    if (DTypeSize(compact) > DTypeSize(h.dtype)) compact = h.dtype;  // advice never widens
    uint16_t tile = h.tile;
    if (frames_ && chw && h.tile == 0) {
      any_rows_ = true;
      tile = static_cast<uint16_t>(kDefaultTileSize);
    }
    advised += RecordAndAux(r, compact, frames_ && chw ? tile : 0);
  }
  samples_ += count;
  bytes_ += sample * count;
  advised_bytes_ += advised * count;
}

StoreProjection StoreProjector::Finish(uint64_t ram_bytes) const {
  StoreProjection p;
  p.samples = samples_;
  p.bytes = bytes_ + kFixedPages * PageSize();
  p.ram_bytes = ram_bytes;
  p.fits = ram_bytes == 0 || static_cast<double>(p.bytes) <= kPageCacheShare * static_cast<double>(ram_bytes);
  std::ostringstream m;
  m << what_ << ": projected store size " << FormatBytes(static_cast<double>(p.bytes)) << " (" << samples_
    << (samples_ == 1 ? " sample" : " samples");
  if (samples_ > 0) m << " of " << FormatBytes(static_cast<double>(bytes_) / static_cast<double>(samples_));
  m << ")";
  if (ram_bytes == 0) {
    m << "; this machine's RAM is unknown";
    p.message = m.str();
    return p;
  }
  m << ", RAM " << FormatBytes(static_cast<double>(ram_bytes));
  if (p.fits) {
    m << ": fits the page cache (at most half of RAM)";
    p.message = m.str();
    return p;
  }
  std::string advice;
  if (frames_ && any_rows_) advice += "--layout tiles";
  if (any_wider_than_compact_) advice += std::string(advice.empty() ? "" : " ") + "--encoding compact";
  std::string half;
  for (const std::string& f : half_fields_) half += " --encoding " + f + "=float16";
  m << ": more than half of RAM, so training will read it from disk in part";
  if (advice.empty() && half.empty()) {
    m << " (its layout and encoding are already the ones for that)";
    p.message = m.str();
    return p;
  }
  p.advice = advice + (advice.empty() ? half.substr(half.empty() ? 0 : 1) : half);
  p.advised_bytes = advised_bytes_ + kFixedPages * PageSize();
  m << ".\n" << what_ << ": stores read from disk are served best by " << (advice.empty() ? "" : advice);
  if (!half.empty()) m << (advice.empty() ? half.substr(1) : half) << " (float16 where half precision is enough)";
  m << ": " << FormatBytes(static_cast<double>(p.advised_bytes)) << " with those flags";
  p.message = m.str();
  return p;
}

}  // namespace patchstore
