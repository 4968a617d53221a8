// ingest/driver.h — the one ingest pipeline every format plugs into
// (ingest-private).
//
// An ingest is: plan the units (samples, volumes) of the input → keep this
// --shard's → skip the ids the store holds already (resume) → decode the
// rest in input order on worker threads (each driving one isolated decoder
// child where the format has one) → commit them in batches, in input order,
// so a store's sample indices do not depend on thread timing and a resumed
// ingest ends as an uninterrupted one → report progress, the projected
// store size and every failure (--on-error skip writes them to the failure
// report; stop commits what came before and returns the error) → seal.
//
// RunIngest owns all of that. A format is an IngestSource: it plans the
// units before the store is opened, checks and records its settings in the
// store's metadata, and decodes one unit into records. Adding a format is
// one source file implementing IngestSource plus its tests; the loop, the
// flags and the messages come from here, the same for every format.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ingest/projection.h"
#include "patchstore/ingest/ingest.h"
#include "patchstore/store/format.h"
#include "patchstore/store/status.h"
#include "patchstore/store/store.h"

namespace patchstore {

// One unit of the input, as planned before the store is opened.
struct IngestUnit {
  std::string id;
  std::string file;  // named in the failure report when `status` fails
  // A failure found while planning (an unreadable file, a bad dataset): the
  // unit is not decoded; it fails in its place in the input order.
  Status status;
  // Kept by every --shard and never skipped as present (a failure without
  // an id of its own, e.g. an HDF5 file that cannot be opened).
  bool every_shard = false;
};

// Reusable payload buffers: a fresh page costs far more to fault in than to
// fill, so decoded units recycle their memory (up to `keep` free buffers).
// Thread-safe.
class BufferPool {
 public:
  struct Buffer {
    std::unique_ptr<float[]> data;
    size_t capacity = 0;  // floats
  };
  explicit BufferPool(size_t keep) : keep_(keep) {}
  // A buffer of at least `bytes` bytes (float-aligned); an empty one when
  // the memory cannot be had.
  Buffer Acquire(size_t bytes);
  void Release(Buffer b);

 private:
  std::mutex mu_;
  size_t keep_;
  std::vector<Buffer> free_;
};

// One record of a decoded unit.
struct UnitField {
  FieldMeta meta;             // as registered with the store (Writer::EnsureField)
  RecordHeader header;        // layout, shape, dtype, norm, tile
  std::string path;           // the file it came from (messages, the report)
  std::string describe;       // what it is, for messages ("" = path)
  BufferPool::Buffer buffer;  // the payload in header.dtype, row-major; or
  // read straight into the record LMDB reserves at commit (streaming
  // sources): a failure then drops the unit from the batch.
  std::function<Status(void* dst)> fill;
};

struct DecodedUnit {
  Status status;            // why the unit failed
  std::string failed_file;  // the file named with it in the failure report
  std::vector<UnitField> fields;
  std::optional<VolumeGeometry> geometry;
  std::vector<std::string> warnings;
  uint64_t bytes = 0;  // the payload as stored (tile padding included)
};

class IngestSource {
 public:
  virtual ~IngestSource() = default;

  // Checks the opened store against this input (fields, the settings a
  // resumed ingest must repeat: CheckResumeSetting, CheckResumeEncoding)
  // and records this ingest's attributes. Called once, after Writer::Open
  // and the --shard check, before anything is decoded.
  virtual Status Prepare(StoreMeta* meta) = 0;

  // The bytes the store's map should start with for `units` (the planned
  // indices this shard keeps); 0: the writer's default.
  virtual uint64_t MapBytes(const std::vector<size_t>& /*units*/) const { return 0; }

  // Adds every unit of `units` to `projector` from what planning read
  // (dataset headers); false when the source knows sizes only once decoded
  // (the driver then projects from the first decoded unit).
  virtual bool Project(const std::vector<size_t>& /*units*/, StoreProjector* /*projector*/) const { return false; }

  // Starts what `slots` worker slots need (isolated decoder children).
  // Called once, only when something is to be decoded.
  virtual Status Start(int /*slots*/) { return Status::OK(); }

  // Decodes planned unit `index` on worker `slot` into records.
  // Thread-safety: called concurrently with different slots (or, for an
  // inline source, on the calling thread only).
  virtual DecodedUnit Decode(size_t index, int slot, BufferPool* buffers) = 0;

  // The error for a field the store refuses (Writer::EnsureField failed
  // with `why`); the default names the unit and the file, and a dtype clash
  // of a compact field as RefusedDType words it.
  virtual Status FieldRefused(const IngestUnit& unit, const UnitField& field, const Status& why,
                              const StoreMeta& meta) const;

  // Warnings found outside Decode (while planning or while a fill reads);
  // the driver collects them after each commit.
  virtual std::vector<std::string> TakeWarnings() { return {}; }
};

// "<noun> 'ID' ('PATH'): field 'F' is stored as uint8 (--encoding compact,
// uint8 sources) but this file is uint16, which needs uint16; give the field
// one <depth>, or --encoding F=float32": the error for a compact field whose
// next file needs another dtype. Empty status when `field` is not such a
// clash.
Status RefusedDType(const std::string& noun, const std::string& depth, const std::string& id, const UnitField& field,
                    const StoreMeta& meta, const std::string& encoding_name);

struct DriverOptions {
  std::string store;
  std::vector<std::string> warnings;  // found while planning the units (they start the summary's)
  WriterOptions writer;               // kind, durable (initial_map_size: IngestSource::MapBytes)
  std::string command_line;           // recorded as the ingest_command attribute
  int threads = 0;                    // decoder threads; 0: all cores
  // Decode on the calling thread, one unit before it is committed (sources
  // whose library is not thread-safe, e.g. HDF5 under Hdf5Lock).
  bool inline_decode = false;
  // Decoded units in flight: per_thread x threads + extra.
  size_t window_per_thread = 2, window_extra = 2;
  size_t keep_buffers = 64;  // free payload buffers kept for reuse
  uint64_t batch_bytes = uint64_t{256} << 20;
  uint64_t batch_samples = 256;  // units per commit at most
  bool skip_errors = false;      // --on-error skip
  std::string report_path;       // "" = <store>/ingest-errors.tsv
  uint32_t shard_index = 0, shard_count = 0;
  bool frames = true;            // the projection's --layout tiles advice applies
  std::string noun = "samples";  // "stopped after N new <noun>"
  ProgressCallback progress;
  std::function<bool()> cancelled;
  // When the ingest began (planning included): summary.seconds, progress.
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

// Checks --shard I/N before anything is read (an out-of-range shard is
// refused before planning).
Status CheckShardOption(const DriverOptions& options);

// The ingest of `units` from `source` (see the top of this file).
// REQUIRES: units planned by `source`, in input order, ids unique.
Result<IngestSummary> RunIngest(const DriverOptions& options, std::vector<IngestUnit> units, IngestSource* source);

}  // namespace patchstore
