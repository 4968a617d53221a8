// ingest/projection.h — the size a store will have, next to this
// machine's RAM, said before an ingest writes (ingest-private).
//
// Layout and encoding are fixed for the life of a store, and what serves a
// store depends on whether it fits the page cache: a store read from the
// page cache is fastest in rows, one read from disk in tiles with compact
// records (docs/guide/larger-than-ram.md, bench/results). So both ingests
// project the store's size from what they know before the first write (image
// ingest: the first decoded sample's records x the number of samples; HDF5
// ingest: every volume's dataset header) and report it through their
// progress callback (Progress::message): the CLI prints it on stderr unless
// --quiet, the Python ingest unless progress=False.
//
// The rule: a store "fits the page cache" when it takes at most half of
// this machine's RAM (kPageCacheShare). The rest is left to the training
// processes, their batches and the GPU's pinned buffers; a store above it is
// read from disk in part once training runs, so for it the message names
// the flags that serve such stores: `--layout tiles` (frames only: a volume
// slice is one contiguous range already), `--encoding compact`, and
// `--encoding FIELD=float16` for the fields compact keeps in float32 (float
// sources such as EXR depth) where half precision is enough.
//
// RAM: MemTotal of /proc/meminfo (sysconf's physical pages where that is
// unreadable), or the environment variable PATCHSTORE_ASSUME_RAM_BYTES
// (a positive integer, bytes) when set: to project for another machine (the
// training node), and for tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ingest/encoding.h"
#include "patchstore/store/format.h"

namespace patchstore {

// The share of RAM a store may take and still be called one that fits the
// page cache.
inline constexpr double kPageCacheShare = 0.5;

// One record of a sample as the ingest will write it.
struct ProjectedRecord {
  std::string field;
  RecordHeader header;  // layout, rank, shape, dtype and tile as written
  bool is_mask = false;
  uint32_t mask_blocks = 0;  // block edge of its mask block counts (0: none)
};

struct StoreProjection {
  uint64_t samples = 0;
  uint64_t bytes = 0;      // projected data.mdb bytes with the chosen layout and encoding
  uint64_t ram_bytes = 0;  // this machine's RAM (or PATCHSTORE_ASSUME_RAM_BYTES)
  bool fits = true;        // bytes <= kPageCacheShare * ram_bytes
  // When the store does not fit and its layout or encoding is not the one
  // for stores read from disk: the flags that are ("--layout tiles
  // --encoding compact --encoding depth=float16"), else "".
  std::string advice;
  uint64_t advised_bytes = 0;  // projected bytes with `advice` (0 when there is none)
  std::string message;         // what ingest reports (one line, or two with advice)
};

// This machine's RAM in bytes: PATCHSTORE_ASSUME_RAM_BYTES when set to a
// positive integer, else MemTotal (/proc/meminfo), else sysconf; 0 when
// unknown.
uint64_t MachineRamBytes();

// The bytes a record takes in data.mdb: LMDB overflow pages of the OS page
// size holding header + body (every record value is at least
// kMinRecordSize, so each has pages of its own). REQUIRES: FinalizeHeader'd.
uint64_t RecordDiskBytes(const RecordHeader& header);

// Sums the projection of a store sample by sample (or `count` samples alike
// at once) and words the result.
class StoreProjector {
 public:
  // `what`: "ingest" (prefix of the message); `frames`: whether --layout
  // tiles applies (image stores; volumes are rows only).
  StoreProjector(std::string what, bool frames) : what_(std::move(what)), frames_(frames) {}

  // Adds `count` samples whose records are `records` (as written: header
  // finalized or not) with ids of about `id_bytes` bytes.
  void Add(const std::vector<ProjectedRecord>& records, uint64_t count, size_t id_bytes = 16);

  // The projection against `ram_bytes` (MachineRamBytes() by default).
  StoreProjection Finish(uint64_t ram_bytes) const;
  StoreProjection Finish() const { return Finish(MachineRamBytes()); }

 private:
  std::string what_;
  bool frames_;
  uint64_t samples_ = 0;
  uint64_t bytes_ = 0, advised_bytes_ = 0;
  bool any_rows_ = false;                 // an image record in rows
  bool any_wider_than_compact_ = false;   // a record wider than its compact dtype
  std::vector<std::string> half_fields_;  // float32 fields compact keeps in float32
};

// "1.5 GiB".
std::string FormatBytes(double bytes);

}  // namespace patchstore
