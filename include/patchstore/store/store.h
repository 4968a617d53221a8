// patchstore/store/store.h — the LMDB environment: writer and read snapshots.
//
// A store is an LMDB environment (a directory holding data.mdb and lock.mdb)
// with named databases, described in store/FORMAT.md:
//   meta     "store" -> StoreMeta text
//   ids      8-byte big-endian sample index -> sample id bytes
//   index    8-byte big-endian sample index -> sample summary
//   records  (sample index, field index) -> record (header + float32 body)
//   geometry 8-byte big-endian sample index -> volume geometry (optional)
// Sample indices are dense, 0..sample_count-1, in commit order.
//
// This layer knows LMDB and bytes, nothing about images. Writers are
// single-process (LMDB allows one write transaction at a time); readers may
// be any number of threads and processes.
//
// Fork: an Env or Snapshot created in one process and destroyed in a forked
// child never calls into LMDB there (that would release the parent's reader
// slot or unmap its memory); the child must open the store again.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "patchstore/store/format.h"
#include "patchstore/store/status.h"

namespace patchstore {

// The version of the patchstore tool, written into the metadata.
const char* ToolVersion();

// One open LMDB environment (defined in store.cc: no public header names an
// LMDB type). Shared by a Snapshot or Writer and whatever they hand out.
class Env;

struct SnapshotOptions {
  // Read without LMDB's lock table. Chosen automatically for sealed stores
  // and for stores in read-only directories when `auto_no_lock` is set.
  bool auto_no_lock = true;
  bool force_no_lock = false;
  // Open a store of an older format (without the summary index) instead of
  // refusing it; only the upgrade path and verify do this.
  bool allow_old_format = false;
};

// What a reader tells the kernel about the pages it will touch (madvise).
// Stores are opened with no readahead (random access: a page fault reads one
// page, not megabytes around it); streaming commands ask for readahead.
enum class Access {
  kRandom,      // no readahead (the default of every read snapshot)
  kSequential,  // aggressive readahead, pages behind may be dropped early
  kWillNeed,    // start reading this range now (asynchronously)
  kDontNeed,    // this process is done with the range: drop it from its RSS
};

// A consistent read-only view of the store: one LMDB read transaction.
// Pointers returned by Get* stay valid for the life of the Snapshot; hold a
// shared_ptr to keep them alive. Lookups are safe from many threads at once
// (LMDB read transactions opened with MDB_NOTLS only read the map).
class Snapshot {
 public:
  // Opens the store at `path` read-only and begins a read transaction.
  // Errors: NotFound (no store there), IOError, Corruption (bad metadata, a
  // data.mdb shorter than LMDB's own size, a sample count that disagrees
  // with the ids database).
  static Result<std::shared_ptr<Snapshot>> Open(const std::string& path, const SnapshotOptions& options = {});
  ~Snapshot();

  const StoreMeta& meta() const { return meta_; }
  const std::string& path() const;
  bool no_lock() const;
  // Number of entries in the ids database.
  uint64_t id_count() const { return id_count_; }

  // Visits every (index, id) in index order. Stops early with the visitor's
  // error status.
  Status ForEachId(const std::function<Status(uint64_t, std::string_view)>& visit) const;
  // Visits every record key with its raw value bytes (unvalidated).
  Status ForEachRecord(
      const std::function<Status(uint64_t sample, uint16_t field, const uint8_t* data, size_t size)>& visit) const;
  // The raw record bytes or NotFound.
  Result<std::string_view> GetRecord(uint64_t sample, uint16_t field) const;

  // Visits every sample summary (the `index` database) in index order,
  // decoded and checked. A store of format 1 has none (NotFound).
  Status ForEachSummary(const std::function<Status(uint64_t, const SampleSummary&)>& visit) const;
  bool has_index() const { return has_index_; }
  // The geometry of volume `sample` (FORMAT.md "Volume geometry"): nullopt
  // when the store has no geometry database (written before it existed, or
  // holding images) or none for this sample; Corruption when the entry is
  // damaged.
  Result<std::optional<VolumeGeometry>> Geometry(uint64_t sample) const;
  bool has_geometry() const { return has_geometry_; }
  // Visits every geometry entry (raw bytes, unvalidated) in index order.
  Status ForEachGeometry(const std::function<Status(uint64_t, const uint8_t*, size_t)>& visit) const;
  // The sealed index blob (FORMAT.md) of a sealed store, unvalidated
  // (DecodeSealedIndex checks it); NotFound when unsealed or absent.
  Result<std::string_view> SealedIndex() const;
  // The input order of a shard sealed by a shard ingest (FORMAT.md
  // "Shards"): one ordinal per sample, in index order. NotFound when the
  // store has none; Corruption when it is damaged or does not list every
  // sample.
  Result<std::vector<uint64_t>> InputOrder() const;

  // Advice for the pages of [data, data + size) (rounded out to pages; for
  // kDontNeed, in to whole pages). kWillNeed goes in pieces of 1 MiB (Linux
  // reads at most its readahead window of one range). REQUIRES: the range
  // lies inside values returned by this snapshot (a record, an id). Best
  // effort: the kernel may ignore it; errors are not reported.
  void Advise(Access access, const void* data, size_t size) const;
  // kWillNeed for many small ranges (e.g. the rows of a window), merged where
  // they share or touch pages: one system call per contiguous run of pages
  // that has a page out of memory, none for runs wholly in memory. Which
  // runs those are is asked of the kernel by one mincore() per cluster of
  // nearby runs (PlanWillNeed), e.g. one per channel of a row-major window;
  // for a tiled one, one per tile row (one for all of a mask's).
  void WillNeed(const std::vector<std::pair<const void*, size_t>>& ranges) const;
  // Whether the page holding `data` is in memory (mincore); false on error.
  bool Resident(const void* data) const;
  // Whether every page of [data, data + size) is in memory (one mincore);
  // false on error or for an empty range.
  bool Resident(const void* data, size_t size) const;

  // OK, or IOError "the store changed since this reader opened it" when a
  // writer committed after this snapshot began and the snapshot holds no
  // slot in LMDB's lock table (a sealed store is read without one), so the
  // writer may have reused the pages this snapshot points into. Cheap (reads
  // the meta pages); readers call it on their error paths, so that damage
  // seen through reused pages is reported as what it is.
  Status CheckUnchanged() const;

 private:
  Snapshot() = default;
  std::shared_ptr<Env> env_;
  void* txn_ = nullptr;  // the LMDB read transaction, opaque so users need no LMDB header
  StoreMeta meta_;
  uint64_t id_count_ = 0;
  bool has_index_ = false;
  bool has_geometry_ = false;
  bool empty_ = false;  // an environment without databases: a store with nothing committed
};

// One record to write: a header (shape, layout, normalisation, source type)
// and the payload, given either as a pointer or as a function that fills the
// reserved space in the map (for streaming). `fill` may be called more than
// once (when the map grows the batch is written again) and must write the
// same bytes each time.
struct RecordInput {
  uint16_t field = 0;  // index into StoreMeta::fields, or kAuxFieldBase + index
  RecordHeader header;
  const void* data = nullptr;  // header.payload_bytes bytes, or
  std::function<Status(void* dst)> fill;
};

struct SampleInput {
  std::string id;
  std::vector<RecordInput> records;
  // Volumes with a physical grid (FORMAT.md "Volume geometry"): written to
  // the `geometry` database in the same transaction as the records.
  std::optional<VolumeGeometry> geometry;
};

struct WriterOptions {
  std::string kind = "frames";                    // of a new store; must match an existing one
  uint64_t initial_map_size = uint64_t{1} << 30;  // grows by doubling when full
  // Commit durability: false skips fsync (fast, for tests and scratch stores).
  bool durable = true;
};

// One LMDB write transaction of a Writer (defined in store.cc).
class WriteTxn;

// The plan of Snapshot::WillNeed, apart from the system calls (tests drive
// it with a made-up residency). `ranges` (address, bytes) become runs of
// whole pages of `page` bytes, each merged with the one before where they
// share or touch pages. Runs that follow each other upwards with gaps of at
// most kWillNeedGapPages pages form a cluster (spanning at most
// kWillNeedSpanPages pages; a run longer than that is a cluster of its own).
// `residency(begin, end, vec)` is called once per cluster, like mincore():
// one byte per page of [begin, end), bit 0 set when the page is in memory;
// false when it cannot tell. Returns the runs, in order, that have a page
// out of memory (every run of a cluster it could not tell about).
// The gap is small because mincore() looks at every page of the span, and
// a page this process never mapped costs a page-cache lookup: 16 pages
// joins the rows of a row-major window and the tile rows of a tiled mask,
// not the tile rows of wider fields (measured: BM_SamplerGatherLayout).
inline constexpr uintptr_t kWillNeedGapPages = 16;
inline constexpr uintptr_t kWillNeedSpanPages = 8192;
using ResidencyFn = std::function<bool(uintptr_t begin, uintptr_t end, unsigned char* vec)>;
std::vector<std::pair<uintptr_t, uintptr_t>> PlanWillNeed(const std::vector<std::pair<const void*, size_t>>& ranges,
                                                          uintptr_t page, const ResidencyFn& residency);

// Writer::AddMaskBlocks' progress, after each of its transactions: samples
// done so far, of `total`. Returning false stops it there (Aborted).
using AddMaskBlocksProgress = std::function<bool(uint64_t done, uint64_t total)>;
// Samples per transaction of Writer::AddMaskBlocks.
constexpr uint64_t kAddMaskBlocksBatch = 1024;

// The single writer of a store. Not thread-safe: use from one thread.
class Writer {
 public:
  // Opens (creating the directory and environment if needed) for writing.
  static Result<std::unique_ptr<Writer>> Open(const std::string& path, const WriterOptions& options);
  ~Writer();

  const StoreMeta& meta() const { return meta_; }
  StoreMeta& mutable_meta() { return meta_; }  // changes are written with the next commit
  bool Contains(const std::string& id) const { return ids_.count(id) != 0; }
  uint64_t sample_count() const { return meta_.sample_count; }

  // Adds a field to the metadata (written with the next commit) and returns
  // its index; if a field of that name exists, checks that channels and
  // layout agree and returns its index.
  Result<uint16_t> EnsureField(const FieldMeta& field);

  // Writes the samples in one transaction and commits it: all of them become
  // visible at once, or none. Ids already present are an error (AlreadyExists);
  // callers skip them first (see Contains). When LMDB's map is full, grows
  // it and writes the batch again. Unseals a sealed store in the same
  // transaction.
  Status WriteBatch(const std::vector<SampleInput>& samples);

  // True when Open found a store of an older format and upgraded it.
  bool upgraded() const { return upgraded_from_ != 0; }
  uint16_t upgraded_from() const { return upgraded_from_; }

  // Gives the 1-channel image mask fields that lack them (written before
  // they existed) mask block counts (FORMAT.md "Mask block counts"): one
  // auxiliary record per mask record, written in transactions of
  // kAddMaskBlocksBatch samples; the last one also sets the fields'
  // mask_blocks, so readers use the tables only once all are there. A kill
  // (or `progress` returning false) midway leaves tables that readers ignore
  // (verify calls them stale) and that running it again replaces. Returns
  // the names of the fields given them (empty: nothing to do). Like
  // appending, it changes a sealed store under its readers: reopen them
  // afterwards.
  // Fields named in `rewrite` (1-channel image masks that have block counts
  // but lack some of their records) get all of theirs rewritten too. While
  // it runs (from its first transaction to its last) the metadata carries
  // the attribute kUpgradingAttribute, so that what a kill leaves is told
  // apart from an older writer's metadata (verify names the cause).
  Result<std::vector<std::string>> AddMaskBlocks(const AddMaskBlocksProgress& progress = nullptr,
                                                 uint64_t batch = kAddMaskBlocksBatch,
                                                 const std::vector<std::string>& rewrite = {});

  // Writes the metadata alone (e.g. after EnsureField) and commits.
  Status CommitMeta();
  // Marks the store sealed (ingest finished) and commits. With
  // `input_ordinal` (a shard ingest: the position of an id in the whole
  // input), also records every sample's ordinal as the store's input order,
  // unless some id has none (then no order is recorded).
  using OrdinalOf = std::function<bool(std::string_view id, uint64_t* ordinal)>;
  Status Seal(const OrdinalOf& input_ordinal = nullptr);

 private:
  Writer() = default;
  Status TryWrite(const std::vector<SampleInput>& samples, bool* map_full);
  Status Grow();
  Status Upgrade(void* txn);  // in the given LMDB write transaction
  Status TrySeal(bool* map_full, const OrdinalOf& input_ordinal);
  Status WriteSamples(WriteTxn& t, const std::vector<SampleInput>& samples, StoreMeta* next_meta);
  Status PutMaskBlocksOf(WriteTxn& t, const std::vector<uint16_t>& fields, uint64_t lo, uint64_t hi);
  // Runs `attempt` (one transaction) again after growing the map while it
  // reports the map full, up to 40 times; "<what> '<path>': map could not
  // grow enough" after that.
  Status GrowingAsNeeded(const std::string& what, const std::function<Status(bool* map_full)>& attempt);
  std::shared_ptr<Env> env_;
  uint16_t upgraded_from_ = 0;
  StoreMeta meta_;
  std::unordered_set<std::string> ids_;
  uint64_t map_size_ = 0;
  int lock_fd_ = -1;
};

// Brings the store at `path` to the current store format in place, in one
// transaction (a kill leaves the old format, never a mix): format 1 -> 2
// adds the sample index. Returns the format it had (equal to
// kStoreFormatVersion when there was nothing to do). Takes the writer lock.
Result<uint16_t> UpgradeStore(const std::string& path);
// Set in the metadata attributes while Writer::AddMaskBlocks runs
// ("mask block counts"); a store that still has it was left by an
// interrupted `patchstore upgrade`.
inline constexpr const char* kUpgradingAttribute = "upgrading";

// Mask records of a field that has block counts (mask_blocks) but lack
// their block-count record: `samples` of them, the first of id `first_id`.
struct MaskBlocksGap {
  std::string field;
  uint64_t samples = 0;
  std::string first_id;
};

// The MaskBlocksGaps of the store at `path` (one per field that has some).
Result<std::vector<MaskBlocksGap>> FindMaskBlocksGaps(const std::string& path);

// Writer::AddMaskBlocks on the store at `path` (takes the writer lock only
// when some field lacks block counts), the fields of FindMaskBlocksGaps
// rewritten as well (those gaps in `*gaps` when given).
Result<std::vector<std::string>> AddMaskBlocks(const std::string& path, const AddMaskBlocksProgress& progress = nullptr,
                                               uint64_t batch = kAddMaskBlocksBatch,
                                               std::vector<MaskBlocksGap>* gaps = nullptr);

}  // namespace patchstore
