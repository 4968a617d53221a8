// patchstore/reader/slice_sampler.h — the items of a SliceDataset: which
// slice of which volume, its crop, flips and turn, and each field's stack
// depth, drawn exactly and deterministically, mask-aware on request.
//
// A volume store (reader/volume.h) holds one (S, H, W) record per (volume,
// field). A SliceSampler turns it into the items that
// patchstore.torch.SliceDataset, `patchstore montage` and `patchstore
// bench` serve:
//
//   SliceOptions o;
//   o.fields = {"MR", "CT"};
//   o.context.fields = {{"MR", 1}};        // MR: 3 slices in; CT: 1 slice out
//   o.crop = {256, 256};
//   o.flip = SliceFlip::kIndependent;
//   o.require = "MASK";                    // every item's crop holds anatomy
//   auto sampler = SliceSampler::Create(reader, o).value();
//   SliceItem it = sampler->Item(/*epoch=*/3, /*i=*/17).value();
//   // copy field f: CopySliceStack(*reader, it.ref.sample, field_f,
//   //     it.ref.slice, sampler->context(f), it.transform, dst)
//
// Items (len(dataset) == size()):
// * Without `require`: item i is flat slice i of the index (every slice of
//   every served volume, volumes in the order of `ids`, slices in order).
// * `require` with `min_valid` (policy min_valid): item i is the i-th slice
//   that qualifies — whose window (the crop, or the whole slice without a
//   crop) can hold at least min_valid valid voxels (non-zero and not NaN, as
//   the frames sampler counts them) of the `require` field at that slice;
//   min_valid < 1 is that fraction of the window. Every epoch serves every
//   qualifying slice once, and its crop is drawn uniformly from the
//   qualifying crops of that slice. Other slices are not served.
// * `positive_fraction` p (policy positive_fraction, with `require`): item i
//   is flat slice i, as without `require`, but each item is a positive draw
//   with probability p and a negative one otherwise: a positive draw serves
//   a qualifying slice with a qualifying crop, a negative draw one whose
//   window does not qualify. Item i's own slice is served when it has a
//   window of the kind drawn; otherwise a slice of that kind is drawn
//   uniformly from the same volume (so each kind's slices of a volume are
//   served equally often, and about p of the items are positive); a volume
//   without that kind serves the other (as MONAI's RandCropByPosNegLabeld on
//   the volume, with the volume's depth as its number of samples).
// * Volumes that give no item (no slice, slices smaller than the crop, or
//   with min_valid no qualifying slice) are left out and reported
//   (skipped(), SkippedReport()); Create fails when none is left.
//
// Draws: key = splitmix::Key(seed, epoch, i, "SLIC") (reader/transform.h).
// The crop, flips and turn are DrawSliceTransform's (reader/volume.h), so a
// sampler without `require` serves exactly what SliceDataset served before
// mask-aware draws existed, and with a mask valid everywhere it serves the
// same items as without one. Mask-aware draws add: the kind from
// Mix(key^5) (WindowPolicy::WantQualifying, reader/sampling_policy.h: the
// frames sampler's policies), a replacement slice from Mix(key^6), crop
// candidates as the frames sampler tries them (candidate 0 is
// DrawSliceTransform's crop, candidate t >= 1 from Mix(key^(0x20+2t)) and
// Mix(key^(0x21+2t)), up to PatchSampler::kWindowTries, each decided by
// counting its mask voxels), and when none fits an exact draw from the
// slice's window lists (built from the slice's summed-area table, the same
// runs as the frames sampler's) with Mix(key^7). Every draw is uniform over
// the windows of its kind, a pure function of (seed, epoch, i) and the
// store: independent of threads, workers and batches.
//
// Which slices qualify is decided once, by Create, from each mask slice's
// valid count (the volume's summary count decides an all-empty or all-valid
// mask without reading it; otherwise the mask volume is read once, on
// num_threads threads, plus a summed-area scan of the slices a crop leaves
// undecided: bench/python_slices_bench.py measures it). The result is one byte per slice
// (slice_flags()), which a process that already has it passes back to
// Create (DataLoader workers, bench processes) instead of reading the masks
// again.
//
// Thread-safety: Create once; every const method may be called from any
// number of threads at once.
//
// Errors (Status): InvalidArgument for bad options (SliceOptions::Validate,
// naming the option as the user spells it), a store of images, rot90 with
// non-square planes, a crop larger than every volume's slices or no
// qualifying slice; NotFound for an unknown field or id; OutOfRange for an
// item outside [0, size()).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/sampler.h"
#include "patchstore/reader/volume.h"

namespace patchstore {

class WindowPolicy;  // reader/sampling_policy.h (internal)

// The slices on each side of an item's centre slice, per field: field f
// gets the stack of Of(f) * 2 + 1 slices. Python: context=C (every field)
// or context={"MR": 1, "CT": 0} (a field not named gets 0); CLI: --context
// C or --context MR=1,CT=0.
struct SliceContext {
  int64_t all = 0;                                      // every field not named below
  std::vector<std::pair<std::string, int64_t>> fields;  // per field
  int64_t Of(const std::string& field) const {
    for (const auto& [name, c] : fields)
      if (name == field) return c;
    return all;
  }
};

// A crop of h x w pixels of every slice; 0 x 0: whole slices.
struct CropSize {
  int64_t h = 0, w = 0;
  bool none() const { return h == 0 && w == 0; }
};

// Values clipped to [lo, hi] after the copy, for `field` ("" every field).
struct SliceClamp {
  std::string field;
  double lo = 0, hi = 0;
};

// The options a user sets on SliceDataset, volume montage and volume bench,
// one row each: the single list from which the Python binding
// (SliceOptions properties, SLICE_OPTIONS, patchstore.SliceConfig and
// SliceDataset's keywords), the CLI flags of montage and bench
// (cli/slice_flags.cc) and the messages of SliceOptions::Validate take their
// names, flags and docs; the defaults are the member initialisers of
// SliceOptions below.
//   X(member, Python keyword, CLI flag ("" = none), one-line doc)
// Adding an option: as for the frames sampler's table (reader/sampler.h,
// docs/architecture/adding-an-option.md), with SliceOptions, Validate
// (reader/slice_sampler.cc) and _config.pyi's SliceConfig.
#define PATCHSTORE_SLICE_OPTIONS(X)                                                                                 \
  X(context, "context", "--context",                                                                                \
    "slices on each side of the centre slice: C for every field, or per field {field: C} (CLI: C or F=C,F=C); a "   \
    "field not named gets 0")                                                                                       \
  X(crop, "crop", "--crop", "random crop of every slice: S (S x S) or (h, w) (CLI: S or H,W); None: whole slices")  \
  X(flip, "flip", "--flip",                                                                                         \
    "random flips: True flips both axes with p = 1/2 (a 180 degree turn, RandFlipd), 'independent' each axis with " \
    "p = 1/2 (CLI: --flip or --flip=independent)")                                                                  \
  X(rot90, "rot90", "--rot90", "random quarter turns: p = 1/2, k in 1..3 (RandRotate90d); needs square planes")     \
  X(seed, "seed", "--seed", "seed of the crops, flips, turns and mask-aware draws")                                 \
  X(require, "require", "--require",                                                                                \
    "mask field whose voxels every served slice (and crop) must hit (None: every slice)")                           \
  X(min_valid, "min_valid", "--min-valid",                                                                          \
    "valid mask voxels a slice's window (crop, or whole slice) needs (>= 1), or that fraction of it (< 1)")         \
  X(positive_fraction, "positive_fraction", "--positive-fraction",                                                  \
    "fraction of items drawn from slices (crops) meeting min_valid, the rest from the others (None, CLI -1: off)")  \
  X(ids, "ids", "--ids", "only these volumes, in this order (ids, or in Python also store indices)")                \
  X(clamp, "clamp", "", "values clipped to (lo, hi) after the copy, or {field: (lo, hi)} (None: no clamp)")         \
  X(clamp_warn, "clamp_warn", "",                                                                                   \
    "warn when a clamp cuts more than this fraction of a batch's values of a field (None, C++ -1: never)")          \
  X(output, "output", "", "items as float32 values, or as the stored dtype ('stored'; to_float converts)")          \
  X(num_threads, "num_threads", "", "copy threads of a batch (Python: 0 = all cores)")

struct SliceOptions {
  std::vector<std::string> fields;  // fields served, e.g. {"MR", "CT", "MASK"}
  SliceContext context;             // 0: single slices
  CropSize crop;                    // 0 x 0: whole slices
  SliceFlip flip = SliceFlip::kNone;
  bool rot90 = false;
  uint64_t seed = 0;
  std::string require;            // mask field, or "" for every slice
  double min_valid = 1;           // voxels (>= 1) or fraction of the window (< 1)
  double positive_fraction = -1;  // < 0: off
  // Subset: volume ids, then store indices, in that order of service; both
  // empty = every volume in store order. NotFound for an unknown id,
  // OutOfRange for an index past the store, InvalidArgument for a volume
  // named twice.
  std::vector<std::string> ids;
  std::vector<uint64_t> samples;
  std::vector<SliceClamp> clamp;  // applied by the loader after the copy
  double clamp_warn = 0.01;       // < 0: never warn
  Output output = Output::kFloat32;
  int num_threads = 1;

  // The policy these options stand for (SamplingPolicy::kUniform without
  // require, kPositiveFraction with positive_fraction, else kMinValid).
  SamplingPolicy ResolvedPolicy() const;
  // The clamp of `field` (the entry naming it, else the "" entry); false
  // when it has none.
  bool ClampOf(const std::string& field, double* lo, double* hi) const;

  // The only check of the option values (Create calls it; the bindings
  // and the CLI call it before opening anything): InvalidArgument naming
  // the option as a user spells it, e.g. "positive_fraction
  // (--positive-fraction) must be in [0, 1] (None, CLI -1: off), got 1.5".
  // What needs the store (field and id names, slice sizes) is checked by
  // SliceSampler::Create.
  Status Validate() const;
};

// "min_valid (--min-valid)", "clamp": how a user spells the option of
// `member` (a member name of the table above), for messages.
std::string SliceOptionSpelling(const std::string& member);

// "independent", "both" or "" (none): the CLI and binding names of a flip
// mode; ParseSliceFlip also takes "true"/"1" (both) and "false"/"0" (none).
const char* SliceFlipName(SliceFlip flip);
Result<SliceFlip> ParseSliceFlip(const std::string& name);

// A SliceContext from its CLI spelling: "2", "MR=1,CT=0" or "1,CT=0"
// (a bare number for every field not named). InvalidArgument otherwise.
Result<SliceContext> ParseSliceContext(const std::string& text);

class SliceSampler {
 public:
  // The per-slice byte of slice_flags(): bit 0 the slice has a window that
  // qualifies, bit 1 one that does not (both 0 without `require`).
  static constexpr uint8_t kPositive = 1, kNegative = 2;

  // Validates the options against the store, selects the volumes that give
  // items and, with `require`, decides which slices qualify — or takes
  // that from `slice_flags` (the slice_flags() of a sampler created with
  // the same options on the same store, one byte per slice of its index),
  // reading no mask. Errors: see the header.
  static Result<std::unique_ptr<SliceSampler>> Create(std::shared_ptr<const Reader> reader, const SliceOptions& options,
                                                      const std::vector<uint8_t>* slice_flags = nullptr);

  const SliceOptions& options() const { return options_; }
  const Reader& reader() const { return *reader_; }
  // The served volumes (after leaving out those that give no item), in
  // service order.
  const SliceIndex& index() const { return index_; }
  // Store field index and stack context of served field f (options().fields
  // order).
  int field_index(size_t f) const { return fields_[f]; }
  int64_t context(size_t f) const { return contexts_[f]; }
  // The `require` field's index, -1 without one.
  int mask_field() const { return mask_field_; }

  // Number of items: a Dataset's len().
  uint64_t size() const { return items_.empty() && !restricted_ ? index_.size() : items_.size(); }
  // The flat slice (of index()) item i stands for. REQUIRES: i < size().
  uint64_t item_slice(uint64_t i) const { return restricted_ ? items_[i] : i; }
  // Volumes left out (sample indices, index order of the subset) and a
  // description of the first four for messages; "" when none.
  const std::vector<uint64_t>& skipped() const { return skipped_; }
  // Volumes considered: the subset's, or the store's.
  uint64_t considered_volumes() const { return considered_volumes_; }
  const std::string& skipped_text() const { return skipped_text_; }
  // "" when no volume is left out; otherwise one line for a warning, the
  // same for every front end: "2 of 5 volumes of 'v.ps' give no item and
  // are skipped (crop 64x64; no slice with >= 10 valid voxels of 'MASK'):
  // 'p1' (32x32 slices), 'p4' (no qualifying slice)".
  std::string SkippedReport() const;
  // Slices of the served volumes that are not items (min_valid leaves out
  // those that do not qualify).
  uint64_t skipped_slices() const { return index_.size() - size(); }
  // One byte per flat slice of index() (kPositive | kNegative; all 0
  // without `require`), for Create in another process.
  const std::vector<uint8_t>& slice_flags() const { return flags_; }

  // Item i of `epoch`: the slice served, its transform, the output plane
  // (rows, columns) and whether it was drawn from the qualifying windows.
  // OutOfRange for i >= size(). Reads the mask voxels of crop candidates
  // (mask-aware crops only).
  Result<SliceItem> Item(uint64_t epoch, uint64_t i) const;
  // Items idx[0..n) of `epoch` into out[0..n), on num_threads threads.
  // Every index is checked before anything is drawn.
  Status Items(uint64_t epoch, const uint64_t* idx, size_t n, SliceItem* out) const;

 private:
  struct Lists;  // a slice's runs of qualifying and other windows (reader/window_sets.h)
  SliceSampler() = default;
  Status ComputeFlags();
  Result<std::shared_ptr<const Lists>> ListsOf(uint64_t sample, int64_t slice, int64_t H, int64_t W,
                                               uint64_t threshold) const;
  // The valid voxels of the h x w window at (y, x) of slice `slice` of the mask of `sample`.
  Result<uint64_t> WindowCount(uint64_t sample, int64_t slice, int64_t y, int64_t x, int64_t h, int64_t w) const;
  // The valid voxels a window of `area` voxels needs.
  uint64_t Threshold(int64_t area) const;

  std::shared_ptr<const Reader> reader_;
  SliceOptions options_;
  std::vector<int> fields_;
  std::vector<int64_t> contexts_;
  int mask_field_ = -1;
  std::shared_ptr<const WindowPolicy> policy_;
  SliceIndex index_;
  bool restricted_ = false;      // items_ lists the items (policy min_valid)
  std::vector<uint64_t> items_;  // flat slices of the items
  std::vector<uint8_t> flags_;   // per flat slice
  // Per volume v: its qualifying slices pos_[pos_first_[v] .. pos_first_[v+1]),
  // and the others likewise (policy positive_fraction).
  std::vector<uint32_t> pos_, neg_;
  std::vector<uint64_t> pos_first_, neg_first_;
  std::vector<uint64_t> skipped_;
  std::string skipped_text_;
  uint64_t considered_volumes_ = 0;

  // Window lists of slices whose candidates all failed, by (sample, slice),
  // bounded by kListCacheBytes (oldest dropped first).
  static constexpr uint64_t kListCacheBytes = uint64_t{64} << 20;
  mutable std::mutex mu_;
  mutable std::unordered_map<uint64_t, std::shared_ptr<const Lists>> lists_;
  mutable std::deque<std::pair<uint64_t, uint64_t>> lists_order_;  // (key, bytes)
  mutable uint64_t lists_bytes_ = 0;
};

}  // namespace patchstore
