// ingest/checks.h — checks an ingest makes before it starts
// (internal to ingest/; not installed).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "patchstore/ingest/ingest.h"
#include "patchstore/store/format.h"
#include "patchstore/store/status.h"
#include "patchstore/store/store.h"
#include "store/shard.h"

namespace patchstore {

// OK when `path` is a regular file (symlinks followed). Otherwise an error
// naming `what` and `path` and saying what it is instead: NotFound when
// missing, InvalidArgument for a directory, FIFO, socket or device (a FIFO
// would block the reader forever), IOError for a permission problem.
// `allow_fifo`: let a FIFO through (an isolated decoder reads it under its
// time limit, so a FIFO that never delivers becomes a timeout).
Status CheckRegularInput(const std::string& path, const std::string& what, bool allow_fifo = false);

// The failure report of --on-error skip must be writable before the ingest
// starts: its folder exists and is writable, and an existing report is a
// writable regular file. Errors name the path and the cause.
Status CheckReportPath(const std::string& path);

// A setting that must stay the same across the ingests that fill one store
// (normalisation spec, ...): stored as meta.attributes[key]. A store that
// already holds samples but no such attribute (written by an older version)
// is not checked. InvalidArgument when the store says otherwise, naming
// `option` and both values; else records `value` (written with the next
// commit).
Status CheckResumeSetting(StoreMeta* meta, const std::string& store, const std::string& key, const std::string& value,
                          const std::string& option);

// --shard I/N of an ingest (shard_count 0: none) against the store: a new
// store records it; a store that is a shard accepts only the same shard;
// a store filled without --shard refuses one. InvalidArgument naming the
// store and both settings; for I/N out of range, a message starting
// "ingest: ".
Status CheckShard(StoreMeta* meta, const std::string& store, uint32_t shard_index, uint32_t shard_count);

// Keeps the elements whose id falls into shard `shard_index` of
// `shard_count` (ShardOfId); all of them when shard_count is 0.
// The position of every id in the whole input of a shard ingest (before
// KeepShard), recorded at seal as the shard's input order so that a shard
// set is numbered as one ingest of the same input (Writer::Seal). Empty
// without shards.
template <class T, class IdOf>
std::shared_ptr<std::unordered_map<std::string, uint64_t>> InputOrdinals(const std::vector<T>& items,
                                                                         uint32_t shard_count, IdOf id_of) {
  if (shard_count == 0) return nullptr;
  auto out = std::make_shared<std::unordered_map<std::string, uint64_t>>();
  out->reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) out->emplace(std::string(id_of(items[i])), i);
  return out;
}

// The Writer::Seal argument for InputOrdinals' map (null: none).
inline Writer::OrdinalOf OrdinalLookup(std::shared_ptr<std::unordered_map<std::string, uint64_t>> ordinals) {
  if (!ordinals) return nullptr;
  return [ordinals](std::string_view id, uint64_t* ordinal) {
    auto it = ordinals->find(std::string(id));
    if (it == ordinals->end()) return false;
    *ordinal = it->second;
    return true;
  };
}

template <typename T, typename IdOf>
void KeepShard(std::vector<T>* items, uint32_t shard_index, uint32_t shard_count, IdOf id_of) {
  if (shard_count == 0) return;
  std::vector<T> kept;
  for (T& it : *items)
    if (ShardOfId(id_of(it), shard_count) == shard_index) kept.push_back(std::move(it));
  items->swap(kept);
}

// The failure report of --on-error skip, shared by the ingests: a TSV of
// (id, file, message) of this run's failures, written from the first one
// (replacing an earlier run's report; see Close for a run without any). Each
// failure is counted in the summary (samples_failed, the first 100 messages
// in errors); report_path / report_error say where it went or why it could
// not be written. Not thread-safe: the writer thread owns it.
class FailureReport {
 public:
  explicit FailureReport(std::string path) : path_(std::move(path)) {}
  ~FailureReport();
  FailureReport(const FailureReport&) = delete;
  FailureReport& operator=(const FailureReport&) = delete;
  const std::string& path() const { return path_; }
  void Add(IngestSummary* summary, const std::string& id, const std::string& file, const Status& st);
  // Closes the file (at the end of an ingest), noting a failed close; with
  // `remove_stale` and no failure added, removes an earlier run's report.
  void Close(IngestSummary* summary, bool remove_stale);

 private:
  std::string path_;
  FILE* file_ = nullptr;
  bool failed_ = false;
};

// The normalisation of a volume field (HDF5 datasets, ITK volumes): `spec`
// as --norm gives it ("" = default: "binary" for a --mask field, else
// "none"), checked against the source type. Errors start with `what` (e.g.
// "reading dataset 'p1' in group 'MR' of 'a.h5'"): "<what>: normalisation
// 'unit' of field 'MR' needs a uint8 or uint16 source, not <type_name> (use
// affine:SCALE,OFFSET)", or "<what> for field 'MR': " and why the spec does
// not parse or does not fit the type.
Result<Normalization> ResolveVolumeNorm(const std::string& spec, bool mask, SourceType source,
                                        const std::string& type_name, const std::string& field,
                                        const std::string& what);

// The checks on source values before they become float32 records, shared by
// every source (HDF5 datasets, ITK volumes, float images). Add() each block
// of values as read, then Finish() once:
//   * 32/64-bit integers: float32 rounds those above 2^24; noted once per
//     volume with the largest magnitude;
//   * float values under a normalisation, which runs in float32 (range: in
//     float64): their finite range must map to finite values (refused, as
//     for each float image's own range; the type's extremes say nothing for
//     float sources);
//   * float64 values beyond float32 with no normalisation: stored as +-inf
//     (as NumPy's astype(float32)), noted once per volume.
class ValueCheck {
 public:
  // `describe` starts each warning (e.g. "dataset 'p1' in group 'MR' of
  // 'a.h5'"); `noun` names the volume in a refusal ("float64 value of this
  // dataset"); `norm_spec` is the --norm text as the user wrote it.
  ValueCheck(std::string describe, std::string noun, SourceType source, const Normalization& norm,
             std::string norm_spec)
      : describe_(std::move(describe)),
        noun_(std::move(noun)),
        source_(source),
        norm_(norm),
        norm_spec_(std::move(norm_spec)) {}

  // `n` values of T (the type the source was read in). A refusal is an
  // InvalidArgument without context ("normalisation 'affine:...' maps ...").
  template <typename T>
  Status Add(const T* x, uint64_t n) {
    if constexpr (std::is_integral_v<T> && sizeof(T) >= 4) {
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t a = x[i] < 0 ? uint64_t{0} - static_cast<uint64_t>(x[i]) : static_cast<uint64_t>(x[i]);
        largest_ = std::max(largest_, a);
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      double lo = INFINITY, hi = -INFINITY;
      for (uint64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) {
          lo = std::min(lo, static_cast<double>(x[i]));
          hi = std::max(hi, static_cast<double>(x[i]));
        }
      if (lo <= hi) return AddFloatRange(lo, hi);
    }
    return Status::OK();
  }

  // The warnings found (the values beyond float32, then the 2^24 rounding).
  std::vector<std::string> Finish();

 private:
  Status AddFloatRange(double lo, double hi);

  std::string describe_, noun_;
  SourceType source_;
  Normalization norm_;
  std::string norm_spec_;
  uint64_t largest_ = 0;  // of 32/64-bit integer values
  bool beyond_ = false;   // a float64 value beyond float32 was reported
  std::vector<std::string> warnings_;
};

}  // namespace patchstore
