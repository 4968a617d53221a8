// ingest/checks.h — checks an ingest makes before it starts
// (internal to ingest/; not installed).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
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
// (id, file, message), opened for appending on the first failure. Each
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
  // Closes the file (at the end of an ingest), noting a failed close.
  void Close(IngestSummary* summary);

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

}  // namespace patchstore
