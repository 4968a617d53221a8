// patchstore/reader/reader.h — zero-copy random access to a store.
//
// Start here. A Reader opens a store read-only, loads its sample index once
// (O(samples x fields) small entries; no record is touched, so opening a
// store that is not in the page cache reads kilobytes) and then serves every request by
// pointer arithmetic into LMDB's memory map: no LMDB call, no copy, no lock
// on the hot path.
//
//   auto reader = patchstore::Reader::Open("/data/frames.ps").value();
//   auto patch  = reader->Patch(reader->Find("video03/0042").value(),
//                               reader->FieldIndex("rgb").value(),
//                               y, x, 256, 256).value();   // (3,256,256) view
//
// Lifetimes: every TensorView returned holds the Reader's snapshot (its
// LMDB read transaction and environment). It stays valid after the Reader is
// destroyed. A Reader sees the store as it was when opened; reopen to see
// samples committed later.
//
// Thread-safety: all const methods may be called from any number of threads
// at once. Processes: open a Reader in each process; a Reader inherited
// across fork() must not be used in the child (InOpeningProcess() tells),
// and destroying it there is safe (it does not touch LMDB).
//
// Errors (Status codes): NotFound for an unknown id or field, OutOfRange for
// an index or patch outside the data, InvalidArgument for bad sizes,
// Corruption for a record that fails validation, IOError from the OS/LMDB.
// Messages name the store, the sample id and the field.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "patchstore/reader/sat.h"
#include "patchstore/reader/tensor_view.h"
#include "patchstore/reader/transform.h"
#include "patchstore/store/format.h"
#include "patchstore/store/status.h"
#include "patchstore/store/store.h"

namespace patchstore {

struct ReaderOptions {
  // Recompute each record's checksum when it is first accessed (costs one
  // pass over the record; catches silent corruption). Off by default.
  bool verify_checksums = false;
  // Read without LMDB's lock table even if the store is not sealed.
  bool no_lock = false;
  // OpenSet: accept some shards of a shard set (each at most once), e.g.
  // the shards one rank reads in rank-local mode. Off: every shard needed.
  bool partial_set = false;
};

// Where one patch comes from and where it goes, for CopyPatches.
struct PatchRequest {
  uint64_t sample = 0;
  int field = 0;
  int64_t y = 0, x = 0;
};

// The ValueTable (reader/tensor_view.h) of a raw-source field of dtype
// uint8, uint16 or int16 normalised by `norm`: every value through
// Normalization::Apply, and the fastest rule that reproduces all of them bit
// for bit (each value is checked through ConvertRun; kLookup when no rule
// does, e.g. "range" normalisation, computed in double). The shared_ptr
// owns the table. REQUIRES: StoresRawSource(dtype).
std::shared_ptr<const ValueTable> MakeValueTable(DType dtype, const Normalization& norm);

// A checked window of one (C,H,W) or (S,H,W) record, located in the map but
// not copied: what the gather kernels (CopyWindow) read from. `payload` is
// the record's payload: row-major, or tiles when `tile` > 0 (TileGrid).
struct WindowSource {
  const uint8_t* payload = nullptr;
  DType dtype = DType::kFloat32;
  const ValueTable* lut = nullptr;  // the field's table for raw-source records (TensorView::lut)
  int64_t C = 0, H = 0, W = 0;
  int64_t tile = 0;  // 0: rows
  int64_t y = 0, x = 0, h = 0, w = 0;
  TileGrid grid() const { return TileGrid{C, H, W, tile}; }
};

// Copies the window of `src` into `dst` as C planes of t.OutputSize(h, w)
// float32 values, flipped then turned by `t` and converted from the record's
// dtype (ConvertElement). Tiled records are cut tile by tile; nothing is
// allocated except a per-thread staging plane for transformed tiled windows.
// `stream`: the untransformed copy of a row-major window writes `dst` with
// non-temporal stores (for outputs larger than the cache:
// StreamThresholdBytes); the values are the same. Tiled windows ignore it
// (their runs start anywhere in an output row; staging whole rows to stream
// them measured no faster: bench/sampler_benchmark BM_SamplerGatherLayout).
void CopyWindow(const WindowSource& src, Transform t, float* dst, bool stream = false);

// What a gather writes: the normalised float32 values (kFloat32), or each
// element as stored (kStored: the field's dtype, FieldMeta::dtype — uint8,
// uint16 or int16 source values of a compact encoding, float16, float32),
// the bytes to ship to a GPU and convert there. Converting a stored
// element with the field's table (ConvertElement(v, Reader::field_table),
// reader/transform.h) gives the kFloat32 value bit for bit.
enum class Output : uint8_t { kFloat32, kStored };

// CopyWindow into `dst` as float32 (`output` kFloat32, as above) or as C
// planes of t.OutputSize(h, w) elements of src.dtype (kStored; `stream` is
// ignored there).
void CopyWindow(const WindowSource& src, Transform t, void* dst, Output output, bool stream = false);

// n elements stored as `dtype` at `src` into float32 at `dst`: what a
// kFloat32 read gives for them, bit for bit (ConvertRun with `table`, the
// field's Reader::field_table, or null for fields without one), on
// num_threads threads (contiguous blocks; the result does not depend on the
// count). What turns an Output::kStored batch into the float32 batch on the
// CPU (patchstore.torch.to_float).
// REQUIRES: src holds n elements of dtype, dst n floats; they do not overlap.
void ConvertStored(DType dtype, const ValueTable* table, const void* src, int64_t n, float* dst, int num_threads = 1);

// Output bytes of one gather above which its windows are streamed
// (CopyWindow's `stream`): the last-level cache's size (sysfs; 32 MiB when
// unknown), or PATCHSTORE_STREAM_BYTES when set (0: always; a huge value:
// never), read once.
int64_t StreamThresholdBytes();

// The number of elements of the window of `src` whose float32 value (as
// CopyWindow gives it) is non-zero and not NaN: what a mask requirement
// counts (reader/sat.h). Reads the window once and writes nothing.
uint64_t CountNonZero(const WindowSource& src);

// The contiguous byte ranges of the map that the window of `src` reads: one
// per row of every channel for rows, one per tile row for tiled records
// (the tiles of a tile row are contiguous). For prefetching (WILLNEED).
std::vector<std::pair<const void*, size_t>> WindowByteRanges(const WindowSource& src);

class Reader {
 public:
  // Opens the store at `path`. Errors: NotFound, Corruption, IOError.
  static Result<std::shared_ptr<Reader>> Open(const std::string& path, const ReaderOptions& options = {});

  // Opens several stores as one (docs/guide/shards.md): a shard set written by
  // `ingest --shard I/N` (every store records I/N: the same N, each I once,
  // in any order given) or stores that are not shards (read in the order
  // given). Global sample order: when every store of the set records an
  // input order (shards sealed by `ingest --shard`, FORMAT.md "Shards") and
  // the ordinals are distinct, the order of that one input — the order a
  // single ingest of the same input gives, so samplers with the same seed
  // serve the same windows from the set as from that store (input_ordered()).
  // Otherwise the stores in shard order (I = 0..N-1, else as given), each in
  // its own index order: sample g is sample g - store_begin(s) of store s. Every store must have the same kind and
  // fields. Errors: InvalidArgument naming the stores for a mix of shard
  // sets, a missing or repeated shard, different fields, or an id held by
  // two stores (naming both); as Open for each store. The meta() of a set is
  // the first store's with sample_count the total and sealed when all are.
  static Result<std::shared_ptr<Reader>> OpenSet(const std::vector<std::string>& paths,
                                                 const ReaderOptions& options = {});

  // For a set, a description: "<first path> (+K more stores)".
  const std::string& path() const { return path_; }
  const StoreMeta& meta() const { return *meta_; }
  bool sealed() const { return meta_->sealed; }
  bool no_lock() const { return no_lock_; }

  // The stores read (1 for Open), in global order.
  size_t store_count() const { return stores_.size(); }
  const std::string& store_path(size_t s) const { return stores_[s].path; }
  // The global index of store s's first sample; store_begin(store_count())
  // is size(). Meaningful only when !input_ordered() (else the stores'
  // samples interleave): use StoreOf / LocalIndex.
  uint64_t store_begin(size_t s) const { return s < stores_.size() ? stores_[s].begin : ids_.size(); }
  // Samples in store s.
  uint64_t store_size(size_t s) const { return store_begin(s + 1) - store_begin(s); }
  // Whether a set is numbered by its input order (see OpenSet).
  bool input_ordered() const { return !order_store_.empty(); }
  // The store holding global sample `sample`. REQUIRES: sample < size().
  size_t StoreOf(uint64_t sample) const;
  // Its index in that store. REQUIRES: sample < size().
  uint64_t LocalIndex(uint64_t sample) const;
  bool InOpeningProcess() const;

  // Samples.
  uint64_t size() const { return ids_.size(); }
  // The id of sample `index`. REQUIRES: index < size(). The view points into
  // the map and lives as long as this Reader.
  std::string_view id(uint64_t index) const { return ids_[index]; }
  // The index of `id`, or NotFound. O(1) (hash table built on first use).
  Result<uint64_t> Find(std::string_view id) const;

  // Fields.
  int field_count() const { return static_cast<int>(meta().fields.size()); }
  const FieldMeta& field(int f) const { return meta().fields[f]; }
  Layout field_layout(int f) const { return meta().fields[f].layout; }
  Result<int> FieldIndex(std::string_view name) const;

  // The header of one record (shape, normalisation, source type). Reads the
  // record's first page; for shapes alone prefer Summary().
  Result<RecordHeader> Header(uint64_t sample, int field) const;

  // What the store's sample index says of one record (shape, layout, dtype,
  // the valid count of a mask) without touching the record itself: no disk
  // read for a store that is not in the page cache. Errors: OutOfRange,
  // NotFound (field, or no such record).
  Result<RecordSummary> Summary(uint64_t sample, int field) const;
  // The physical grid of volume `sample` (store/format.h VolumeGeometry:
  // spacing, origin, direction of the (S,H,W) records read as an image of
  // index (w, h, s), LPS millimetres): nullopt for images and for volumes
  // ingested without one (HDF5, or stores written before geometry existed).
  // Reads a small value from the store. Errors: OutOfRange, Corruption.
  Result<std::optional<VolumeGeometry>> Geometry(uint64_t sample) const;

  // The same, unchecked. REQUIRES: sample < size(), 0 <= field < field_count().
  const RecordSummary& summary(uint64_t sample, int field) const {
    return summaries_[sample * meta().fields.size() + field];
  }

  // A view of a whole record: (C,H,W) for images, (S,H,W) for volumes, of
  // the record's dtype (the field's), row-major. Zero-copy into the map for
  // row records; for a tiled record (FORMAT.md "Tiled records") a row-major
  // COPY (of the stored dtype) that the view owns. Views of raw-source
  // records (uint8/uint16/int16) carry the field's table in `lut`; use
  // AsFloat32 (tensor_view.h) for normalised float32 values.
  Result<TensorView> Get(uint64_t sample, int field) const;

  // A (C,h,w) view of the window [y, y+h) x [x, x+w) of an image record, or
  // (S,h,w) of a volume record. No copy for row records; a row-major copy
  // of the window, owned by the view, for tiled ones. OutOfRange when the
  // window leaves the record; InvalidArgument when h or w is not positive.
  // The window's bytes are requested first (PrefetchWindows), as by every
  // window read below, so a store out of the page cache is read in a few
  // requests instead of one page fault per row.
  Result<TensorView> Patch(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w) const;

  // The same window located for the gather kernels (CopyWindow,
  // WindowByteRanges): checked as Patch, never copied, for both layouts.
  Result<WindowSource> Window(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w) const;

  // The field's table of normalised values for raw-source dtypes
  // (TensorView::lut), built once at open by MakeValueTable; null for float
  // fields.
  const ValueTable* field_table(int field) const { return tables_[field].get(); }

  // Copies that window into `dst`, a contiguous (C,h,w) float32 buffer of
  // at least C*h*w floats owned by the caller, converting from the record's
  // dtype (CopyToFloat32).
  Status CopyPatch(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w, float* dst) const;

  // Copies N windows of one size into `dst`, a contiguous (N,C,h,w) buffer,
  // on `num_threads` threads (1 = the calling thread). All requests must
  // name fields with the same channel count C. Every request is checked
  // before anything is copied; on error nothing useful is in `dst`. The
  // byte ranges of all N windows are requested (PrefetchWindows) before the
  // first is copied, as PatchSampler's gather does.
  Status CopyPatches(const std::vector<PatchRequest>& requests, int64_t h, int64_t w, float* dst,
                     int num_threads = 1) const;

  // The summed-area table of mask field `field` for `sample`: the one stored
  // at ingest by format-1 stores (zero-copy), or computed from the mask
  // record — and, with `cache`, kept in this Reader (unbounded: callers that
  // visit many samples pass false and keep what they derive). One plane per
  // image record, one per slice for volumes. With `scratch` (and no cache),
  // an image mask's table is computed into *scratch, reused from call to
  // call (no fresh pages to fault in and zero), from strips of the record
  // converted in cache-sized pieces (no whole-record copies); the view then
  // holds no owner and is valid while *scratch is left alone. Errors: as
  // Get(); InvalidArgument when the field is not 1-channel.
  Result<SatView> Sat(uint64_t sample, int field, bool cache = true, std::vector<uint32_t>* scratch = nullptr) const;

  // The block counts of mask field `field` for `sample` (reader/sat.h,
  // FORMAT.md "Mask block counts"): zero-copy, header and body checksum
  // checked on every call (a few kilobytes). NotFound when the field has
  // none (its store was written before them, or it is not a 1-channel image
  // mask) or the sample has no such record; Corruption when the store says
  // the field has them and the record is missing or damaged.
  Result<MaskBlocksView> MaskBlocks(uint64_t sample, int field) const;
  // Their block edge B, from the sample's store's metadata alone; 0 when
  // there are none (or sample/field is out of range).
  uint32_t MaskBlockEdge(uint64_t sample, int field) const;
  // Read-ahead of those counts (no-op where there are none).
  void PrefetchMaskBlocks(uint64_t sample, int field) const;

  // Read-ahead hints for stores that are not in the page cache (the map is
  // opened without kernel readahead). Both only start reads and return at
  // once; they never fail (a bad sample or field is ignored).
  //   Prefetch: the whole record.
  //   PrefetchWindow: the rows of a window view from Patch(), merged into
  //   as few requests as their pages allow, only runs with a page out of
  //   memory (Snapshot::WillNeed: one mincore per call).
  //   PrefetchBytes: [data, data + size) of a view of this Reader (e.g. the
  //   contiguous slices of a volume stack), likewise.
  void Prefetch(uint64_t sample, int field) const;
  void PrefetchWindow(const TensorView& window) const;
  void PrefetchBytes(const void* data, size_t size) const;
  // PrefetchPatch: the bytes the window [y, y+h) x [x, x+w) of a record
  // will be read from, computed from the record's location and the sample
  // index's shape alone (no Patch(), no header read, no view): one
  // madvise(WILLNEED) per run of adjacent rows that has a page out of
  // memory (one mincore tells). For read-ahead of windows that will
  // be gathered later (the sampler's next batch). Never fails: a bad
  // sample, field or window, a missing record or a Reader used in a forked
  // child is ignored.
  void PrefetchPatch(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w) const;
  //   PrefetchRanges: byte ranges of this Reader's map (WindowByteRanges of
  //   a Window(), e.g. the tile rows of a tiled window), those with a page
  //   out of memory, in one call.
  void PrefetchRanges(const std::vector<std::pair<const void*, size_t>>& ranges) const;
  //   PrefetchWindows: the byte ranges (WindowByteRanges: rows, or tile
  //   rows) of every window located by Window(), one WillNeed per window, so
  //   that a gather that copies them next finds the disk busy with all of
  //   them at once. The one read-ahead of window reads: Patch, CopyPatch,
  //   CopyPatches and PatchSampler's gather call it. Counted in
  //   windows_read_ahead().
  void PrefetchWindows(const std::vector<WindowSource>& windows) const;
  // Windows passed to PrefetchWindows by this Reader so far (whether or not
  // their pages were already in memory): for tests and diagnostics.
  uint64_t windows_read_ahead() const { return windows_read_ahead_.load(std::memory_order_relaxed); }
  // Whether every page of the record (sample, field) is in memory (one
  // mincore over its bytes): e.g. whether reading a whole mask costs no disk
  // read. False for a bad sample or field or a missing record.
  bool RecordResident(uint64_t sample, int field) const;

  // Recomputes the checksum of one record (VerifyRecordBody).
  Status Verify(uint64_t sample, int field) const;

  // "'<id>' field '<name>' in '<path>'": the context used in messages.
  std::string Describe(uint64_t sample, int field) const;

  // The snapshot that views keep alive (for bindings that need an owner);
  // for a set, the first store's (views of a set own all the snapshots).
  std::shared_ptr<const Snapshot> snapshot() const { return snapshot_; }

 private:
  friend struct ReaderTestAccess;  // tests/reader/prefetch_order_test.cc: WindowRanges
  struct RecordRef {
    const uint8_t* data = nullptr;  // null: record missing
    uint64_t size = 0;
  };
  struct RecordSlot {
    std::atomic<const uint8_t*> data{nullptr};
    std::atomic<uint64_t> size{0};
    std::atomic<uint8_t> state{0};  // 1: data/size resolved
  };
  struct StoreRef {
    std::shared_ptr<Snapshot> snapshot;
    std::string path;
    uint64_t begin = 0;  // global index of its first sample
  };
  Reader() = default;
  Status Index();
  void BuildFieldTables();
  // The owner of views of field f: the snapshot(s) and the field's table.
  const std::shared_ptr<const void>& view_owner(int f) const { return view_owners_[f]; }
  Status IndexStore(size_t store);
  // OpenSet: renumbers the samples by the stores' input orders when all
  // have one (order_store_/order_local_); a no-op otherwise.
  Status OrderByInput();
  // The store of `sample` and the sample's index in it.
  const StoreRef& Locate(uint64_t sample, uint64_t* local) const;
  // UnlessChanged over the store of `sample` (every store when sample is out of range).
  Status UnlessChangedAt(uint64_t sample, Status st) const;
  // The record's bytes (data null: the index lists no such record).
  Result<RecordRef> Ref(uint64_t sample, int field) const;
  Result<RecordHeader> CheckedHeader(uint64_t sample, int field, const uint8_t** data_out = nullptr) const;
  bool field_has_sat(int f) const { return meta().fields[f].has_sat; }
  // The byte ranges a window of a record occupies in the map, in read
  // order, adjacent ones merged (PrefetchPatch); empty for anything
  // invalid. Rows layout: one range per channel row, (c, y..y+h). Tiled
  // records: see the tiled branch (the only place a layout's window bytes are
  // computed for read-ahead; add a layout here).
  void WindowRanges(uint64_t sample, int field, int64_t y, int64_t x, int64_t h, int64_t w,
                    std::vector<std::pair<const void*, size_t>>* out) const;

  std::string path_;
  ReaderOptions options_;
  std::shared_ptr<Snapshot> snapshot_;
  std::vector<StoreRef> stores_;       // one for Open
  std::vector<uint32_t> order_store_;  // input-ordered sets: the store of each global sample
  std::vector<uint64_t> order_local_;  // and its index in that store
  const StoreMeta* meta_ = nullptr;    // snapshot_->meta(), or set_meta_
  StoreMeta set_meta_;
  std::shared_ptr<const void> owner_;                      // what views hold: snapshot_, or all the snapshots of a set
  std::vector<std::shared_ptr<const ValueTable>> tables_;  // per field; null for float fields
  std::vector<std::shared_ptr<const void>> view_owners_;   // per field: owner_ + the table
  bool no_lock_ = false;
  std::vector<std::string_view> ids_;
  // Ids read from a sealed index are copied here (one string per store): that
  // value's pages are freed (and may be reused) when a writer later appends to the store.
  std::vector<std::unique_ptr<std::string>> id_arenas_;
  std::unique_ptr<RecordSlot[]> slots_;  // sample * field_count + field, resolved on first access
  size_t slot_count_ = 0;
  std::vector<RecordSummary> summaries_;  // from the sample index, same indexing
  mutable std::mutex sat_mu_;
  mutable std::unordered_map<uint64_t, SatView> sat_cache_;  // computed tables
  std::unique_ptr<std::atomic<uint8_t>[]> verified_;         // with verify_checksums
  mutable std::once_flag find_once_;
  mutable std::unordered_map<std::string_view, uint64_t> find_;
  pid_t pid_ = 0;
  mutable std::atomic<uint64_t> windows_read_ahead_{0};
};

}  // namespace patchstore
