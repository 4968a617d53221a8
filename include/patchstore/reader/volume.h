// patchstore/reader/volume.h — slices of 3D volumes as training samples.
//
// A store of kind "volumes" (written by `patchstore ingest hdf5`) holds one
// float32 record of shape (S, H, W) per (volume, field): slice-major, so a
// slice, or a stack of neighbouring slices, is a contiguous block of the map.
// This header turns such a store into a flat list of 2D samples, the way a
// PyTorch Dataset over slices wants it:
//
//   auto reader = patchstore::Reader::Open("/data/synthrad.ps").value();
//   auto index  = patchstore::SliceIndex::Build(*reader).value();
//   // len(dataset) == index.size(); item i:
//   patchstore::SliceRef ref = index[i];               // (volume, slice)
//   int mr = reader->FieldIndex("MR").value();
//   auto view = patchstore::SliceStack(*reader, ref.sample, mr, ref.slice, 2);
//   // (5, H, W): slices ref.slice-2 .. ref.slice+2
//
//   // Augmented training item, written straight into a caller buffer:
//   patchstore::SliceTransform t;
//   t.y = 17; t.x = 40; t.height = t.width = 256;   // crop first,
//   t.flip_h = true;                                 // then flips,
//   t.rot90 = 1;                                     // then np.rot90
//   patchstore::CopySliceStack(*reader, ref.sample, mr, ref.slice, 2, t, dst);
//
// Lifetimes: views hold the Reader's snapshot (see reader/tensor_view.h);
// a SliceIndex is a plain value, valid for the Reader it was built from.
//
// Thread-safety: everything here is const and may be called from any number
// of threads at once. Nothing here links HDF5 or image libraries.
//
// Errors (Status codes): NotFound for an unknown field or a missing record,
// OutOfRange for a slice or crop outside the volume, InvalidArgument for a
// record that is not a volume (layout kSHW, rank 3), a negative context or
// a bad crop size. Messages name the sample id, the field and the store.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "patchstore/reader/reader.h"
#include "patchstore/reader/tensor_view.h"
#include "patchstore/reader/transform.h"
#include "patchstore/store/status.h"

namespace patchstore {

// The whole (S, H, W) view of one volume record. No copy. The record's bytes
// are requested at once (Reader::Prefetch): a whole volume is usually read
// whole. InvalidArgument when the record is not a volume (layout kSHW, rank 3).
Result<TensorView> Volume(const Reader& reader, uint64_t sample, int field);

// One slice of one volume.
struct SliceRef {
  uint64_t sample = 0;  // Reader sample index
  int64_t slice = 0;    // 0 .. depth-1
  int64_t depth = 0;    // S of that volume
};

// Enumerates every (volume, slice) pair of a volume store, volumes in the
// order given (default: sample index order), slices in order. Lookup of a
// flat index is O(1): a table of one 32-bit volume number per slice (4 bytes
// per slice) plus one prefix sum per volume.
class SliceIndex {
 public:
  SliceIndex() = default;

  // Indexes every sample of `reader`. For each sample, every field must
  // hold a volume record and all of them the same (S, H, W); otherwise
  // InvalidArgument (or NotFound for a missing record) naming the sample.
  // Costs one header parse per record.
  static Result<SliceIndex> Build(const Reader& reader);
  // Indexes only `samples` (e.g. a train or validation split), in that
  // order; a sample may not appear twice.
  static Result<SliceIndex> Build(const Reader& reader, const std::vector<uint64_t>& samples);

  // Number of slices over all indexed volumes: a Dataset's len().
  uint64_t size() const { return volume_of_.size(); }
  uint64_t volume_count() const { return samples_.size(); }
  // The sample index, depth S, height and width of indexed volume `v`.
  uint64_t sample(uint64_t v) const { return samples_[v]; }
  int64_t depth(uint64_t v) const { return static_cast<int64_t>(first_[v + 1] - first_[v]); }
  int64_t height(uint64_t v) const { return hw_[v].first; }
  int64_t width(uint64_t v) const { return hw_[v].second; }
  // Whether indexed volume `v` gives items with a crop of crop_h x crop_w
  // (0 x 0: whole slices): it has a slice, and its slices are no smaller
  // than the crop. The one rule by which SliceDataset and `patchstore
  // montage` leave volumes out (and fail when none is left).
  bool GivesItems(uint64_t v, int64_t crop_h, int64_t crop_w) const {
    return depth(v) > 0 && crop_h <= height(v) && crop_w <= width(v);
  }
  // Flat index of slice 0 of volume `v`; first(volume_count()) == size().
  uint64_t first(uint64_t v) const { return first_[v]; }
  // The indexed volume holding flat slice `i`. REQUIRES: i < size(). O(1).
  uint64_t volume_of(uint64_t i) const { return volume_of_[i]; }

  // REQUIRES: i < size(). O(1).
  SliceRef operator[](uint64_t i) const {
    const uint64_t v = volume_of_[i];
    return SliceRef{samples_[v], static_cast<int64_t>(i - first_[v]), depth(v)};
  }
  // The same with a range check (OutOfRange).
  Result<SliceRef> At(uint64_t i) const;

 private:
  std::vector<uint64_t> samples_;
  std::vector<uint64_t> first_;  // volume_count() + 1 prefix sums
  std::vector<std::pair<int64_t, int64_t>> hw_;
  std::vector<uint32_t> volume_of_;
};

// The volumes of `index` split by SliceIndex::GivesItems, as SliceDataset
// and `patchstore montage` serve them: `kept` and
// `skipped` hold sample indices in index order; `skipped_text` describes the
// first four skipped for messages ("'p1' (64x64 slices), 'p2' (no slice),
// ...", ids from `reader`), empty when none is.
struct VolumeSelection {
  std::vector<uint64_t> kept, skipped;
  std::string skipped_text;
};
VolumeSelection SelectVolumesGivingItems(const Reader& reader, const SliceIndex& index, int64_t crop_h, int64_t crop_w);

// Slices slice-context .. slice+context of one volume, as a (2*context+1,
// H, W) view. Where the stack runs past either end of the volume the end
// slice is repeated ("replicate" padding: indices are clamped to [0, S-1]),
// so a context larger than the volume is fine.
//   * Entirely inside the volume: a zero-copy view into the map.
//   * Crossing an end: an owned, contiguous copy (the view's owner is its
//     buffer); this costs one copy of the stack.
// Either way the result is contiguous, and the stack's slices are requested
// at once before anything is read (Reader::PrefetchBytes). OutOfRange when
// slice is not in [0, S); InvalidArgument when context < 0.
Result<TensorView> SliceStack(const Reader& reader, uint64_t sample, int field, int64_t slice, int64_t context);

// A crop, flips and a rotation applied to every slice of a stack while it is
// copied. Applied in this order, each on the last two axes (rows, columns):
//   1. crop:   a = a[..., y:y+height, x:x+width]
//              (height == 0 and width == 0: no crop; y and x must then be 0)
//   2. flips:  if flip_v: a = np.flip(a, axis=-2)   (upside down)
//              if flip_h: a = np.flip(a, axis=-1)   (mirror left-right)
//   3. rotate: a = np.rot90(a, rot90, axes=(-2, -1))  (counter-clockwise for
//              k = 1, as NumPy; rot90 is taken modulo 4, so -1 == 3)
// The output plane is (height, width), or (width, height) for odd rot90.
// The crop of the slice API plus the one Transform (reader/transform.h),
// spelled with named flags for callers and the Python SliceTransform;
// transform() is what the copy kernel applies.
struct SliceTransform {
  int64_t y = 0, x = 0;
  int64_t height = 0, width = 0;
  bool flip_v = false;
  bool flip_h = false;
  int rot90 = 0;

  // True when the transform leaves a plane as it is.
  bool identity() const { return height == 0 && width == 0 && !flip_v && !flip_h && (rot90 % 4) == 0; }
  // The flips and turns as the one Transform (rot90 modulo 4).
  Transform transform() const { return Transform::Of(flip_v, flip_h, rot90); }
  // The output (rows, columns) for an H x W plane, before any checking.
  std::pair<int64_t, int64_t> OutputSize(int64_t H, int64_t W) const;
  // OutOfRange/InvalidArgument when the crop does not fit an H x W plane.
  Status Check(int64_t H, int64_t W) const;
};

// Applies `t` to one H x W plane whose rows are `row_stride` floats apart,
// writing OutputSize(H, W) contiguous floats to `dst` with the one copy
// kernel, CopyTransformed (reader/transform.h). Returns Check's error, else
// OK.
Status TransformPlane(const float* src, int64_t H, int64_t W, int64_t row_stride, const SliceTransform& t, float* dst);

// Copies the stack of SliceStack (same replicate rule at the ends) into
// `dst`, a contiguous (2*context+1, h, w) float32 buffer owned by the
// caller, applying `t` to every slice during the one copy; (h, w) =
// t.OutputSize(H, W). Nothing is written when an argument is bad.
Status CopySliceStack(const Reader& reader, uint64_t sample, int field, int64_t slice, int64_t context,
                      const SliceTransform& t, float* dst);

// One item of a batch for CopySliceStacks.
struct SliceStackRequest {
  uint64_t sample = 0;
  int field = 0;
  int64_t slice = 0;
  SliceTransform transform;
};

// Copies N stacks of one output shape into `dst`, a contiguous
// (N, 2*context+1, h, w) buffer, on `num_threads` threads (1 = the calling
// thread). All requests must give the same (h, w) (InvalidArgument
// otherwise). Every request is checked before anything is copied.
Status CopySliceStacks(const Reader& reader, const std::vector<SliceStackRequest>& requests, int64_t context,
                       float* dst, int num_threads = 1);
// The same into `dst` as float32 (Output::kFloat32) or as the records'
// stored dtype (Output::kStored, reader/reader.h; every request's record of
// the same dtype, InvalidArgument otherwise).
Status CopySliceStacks(const Reader& reader, const std::vector<SliceStackRequest>& requests, int64_t context, void* dst,
                       Output output, int num_threads = 1);

// How SliceDataset flips (patchstore.torch.SliceDataset(flip=...)).
enum class SliceFlip { kNone, kBoth, kIndependent };  // False, True, "independent"

// The transform SliceDataset gives flat item `index` in `epoch` for an H x W
// slice, drawn with the one counter-based generator (reader/transform.h):
// key = splitmix::Key(seed, epoch, index, "SLIC" = 0x534C4943); crop from
// Mix(key^1), Mix(key^2), flips from Mix(key^3), quarter turns from
// Mix(key^4); uniform integers below n with splitmix::Below32. crop_h ==
// crop_w == 0: no crop. REQUIRES: crop_h <= H and crop_w <= W.
SliceTransform DrawSliceTransform(uint64_t seed, uint64_t epoch, uint64_t index, int64_t H, int64_t W, int64_t crop_h,
                                  int64_t crop_w, SliceFlip flip, bool rot90);

// One item of a SliceDataset (reader/slice_sampler.h SliceSampler::Item):
// which slice is served, its transform, the output plane (rows, columns)
// it gives, and whether a mask-aware draw took it from the qualifying
// windows (always true without a mask).
struct SliceItem {
  SliceRef ref;
  SliceTransform transform;
  int64_t out_h = 0, out_w = 0;
  bool positive = true;
};

}  // namespace patchstore
